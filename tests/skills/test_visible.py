"""`visible()`: what an approval prompt (and every listing of a stranger's words) shows is what
runs. Every character that is invisible, moves the text around or breaks the line becomes a
visible escape; what a person can read stays as it is."""

from __future__ import annotations

import pytest

from skills.base import visible


@pytest.mark.parametrize("char, escape", [
    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),  # line and paragraph separators
    ("\u202a", "\\u202a"), ("\u202e", "\\u202e"), ("\u2066", "\\u2066"), ("\u2069", "\\u2069"),
    ("\u200e", "\\u200e"), ("\u200f", "\\u200f"), ("\u061c", "\\u061c"),  # bidi controls
    ("\u200b", "\\u200b"), ("\u200c", "\\u200c"), ("\u200d", "\\u200d"), ("\u2060", "\\u2060"),
    ("\ufeff", "\\ufeff"),  # zero-width
    ("\U000e0001", "\\U000e0001"), ("\U000e0041", "\\U000e0041"), ("\U000e007f", "\\U000e007f"),
    ("\ue000", "\\ue000"), ("\U000f0000", "\\U000f0000"),  # private use
    ("\u0378", "\\u0378"),  # unassigned
    ("\x00", "\\u0000"), ("\n", "\\u000a"), ("\r", "\\u000d"), ("\x1b", "\\u001b"), ("\x85", "\\u0085"),
    ("\u00a0", "\\u00a0"), ("\u3000", "\\u3000"), ("\u2009", "\\u2009"),  # spaces that are not " "
    ("\u3164", "\\u3164"), ("\u034f", "\\u034f"),  # blank letters, the grapheme joiner
])
def test_invisible_and_reordering_characters_become_escapes(char, escape):
    assert visible(f"rm a{char}b") == f"rm a{escape}b"


def test_what_a_person_reads_is_left_as_it_is():
    text = "echo `id` && ls **safe** ||x|| \\n é 日本 👍 <b>&amp;</b>"
    assert visible(text) == text


def test_an_escape_is_unambiguous_past_the_basic_plane():
    # "\ue0041" would read as U+E004 followed by "1".
    assert visible("a\U000e0041") == "a\\U000e0041"
