"""Replies split to a channel's limit: content and order kept, boundaries chosen well, code fences
closed and reopened across pieces."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest

from openclaw.gateway.outbox import chunk_text


def words(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "epsilon"]) for _ in range(n))


def test_short_text_is_one_piece():
    assert chunk_text("hello", 4096) == ["hello"]


def test_ten_thousand_characters_keep_order_and_content():
    paragraphs = [words(40, seed=i) for i in range(60)]
    text = "\n\n".join(paragraphs)
    assert len(text) > 10_000
    pieces = chunk_text(text, 4096)
    assert all(len(p) <= 4096 for p in pieces)
    assert len(pieces) >= 3
    # every piece ends at a paragraph boundary, so rejoining with blank lines restores the text
    assert "\n\n".join(pieces) == text


def test_falls_back_to_lines_then_words():
    text = "\n".join(words(30, seed=i) for i in range(10))  # no paragraphs
    pieces = chunk_text(text, 300)
    assert all(len(p) <= 300 for p in pieces)
    assert "\n".join(pieces) == text
    one_line = words(200)
    pieces = chunk_text(one_line, 100)
    assert all(len(p) <= 100 for p in pieces)
    assert " ".join(pieces) == one_line


def test_a_code_block_split_across_pieces_is_closed_and_reopened():
    code = "\n".join(f"    print({i})" for i in range(200))
    text = f"Here:\n\n```python\n{code}\n```\n\nDone."
    pieces = chunk_text(text, 500)
    assert len(pieces) > 2
    for piece in pieces:
        assert len(piece) <= 500
        assert piece.count("```") % 2 == 0, piece  # every piece renders on its own
    assert pieces[1].startswith("```python\n")
    body = [line for p in pieces for line in p.split("\n") if line.startswith("    print(")]
    assert body == code.split("\n")  # no line lost or duplicated


def test_a_word_longer_than_the_limit_is_cut_hard():
    pieces = chunk_text("x" * 250, 100)
    assert "".join(pieces) == "x" * 250
    assert all(len(p) <= 100 for p in pieces)


def test_limit_too_small_is_refused():
    with pytest.raises(ValueError):
        chunk_text("hello", 4)


def squeezed(text: str) -> str:
    """The text without whitespace and backticks: what pieces must keep, wherever they are cut."""
    return re.sub(r"[\s`]", "", text)


def chunk_in_a_child(text: str, limit: int) -> list[str]:
    """chunk_text run in a child process with a time and memory limit: the loops these tests
    guard against never end and grow a list by a piece each round (gigabytes a second)."""
    code = ("import json, resource, sys; from openclaw.gateway.outbox import chunk_text\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "text, limit = json.load(sys.stdin)\n"
            "print(json.dumps(chunk_text(text, limit)))\n")
    try:
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps([text, limit]),
                              capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chunk_text({len(text)} characters, {limit}) did not finish in 30 s")
    assert done.returncode == 0, f"chunk_text failed: {done.stderr[-2000:]}"
    return json.loads(done.stdout)


@pytest.mark.parametrize("text", [
    # a model's one-line ```...``` as long as a message: code, not a fence to reopen
    '```{"results": [' + ", ".join(f'{{"id": {i}}}' for i in range(400)) + "]}```\nDone.",
    # an opening fence line longer than a message (its "info string" is text, not a language)
    "Here:\n```" + "word " * 1000 + "\n```",
], ids=["one-line-code", "long-fence-line"])
def test_a_fence_line_longer_than_a_message_is_split_and_nothing_is_lost(text):
    pieces = chunk_in_a_child(text, 2000)
    assert 2 <= len(pieces) <= 4
    assert all(len(p) <= 2000 for p in pieces)
    assert squeezed("".join(pieces)) == squeezed(text)


def test_a_code_block_split_at_the_smallest_limit_comes_to_an_end():
    text = "```python\n" + "\n".join(f"x = {i}" for i in range(40)) + "\n```"
    pieces = chunk_in_a_child(text, 16)
    assert all(len(p) <= 16 for p in pieces)
    assert squeezed("".join(pieces)).removeprefix("python") == squeezed(text).removeprefix("python")
