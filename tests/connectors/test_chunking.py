"""Replies split to a channel's limit: content and order kept, boundaries chosen well, code fences
closed and reopened across pieces."""

from __future__ import annotations

import random

import pytest

from connectors.base import chunk_text


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
