"""Tokenizer.encode keeps the texts it encoded (engine/tokenizer.py, ENCODED_BYTES,
ENCODED_TEXT_CHARS): a kept answer is what the tokenizer itself says (special-token text
included, with special tokens on and off), the list returned is the caller's own, and what is
kept stays within its budget, the oldest going first. On the embedded model's tokenizer."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine import tokenizer as tokenizer_module

SPECIAL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


class _CountingBackend:
    """The real backend, its encode calls counted (settings pass through to it)."""

    def __init__(self, backend) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "encodes", [])

    def encode(self, text, **kwargs):
        self.encodes.append(text)
        return self._backend.encode(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def __setattr__(self, name, value):
        setattr(self._backend, name, value)


def _own(tokenizer):
    """A copy of the session's tokenizer with nothing kept, encoding through a counting backend."""
    return dataclasses.replace(tokenizer, backend=_CountingBackend(tokenizer.backend))


def _text(rng: random.Random) -> str:
    pieces = [*SPECIAL, " ", "\n", "hello", " world", "é", "🙂", "ß", "\u2581", "<|", "|>", "\x00"]
    parts = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.5:
            parts.append(rng.choice(pieces))
        else:
            parts.append("".join(chr(rng.choice((rng.randint(32, 0x2FF), rng.randint(0x3000, 0x9FFF),
                                                 rng.randint(0x1F300, 0x1F6FF))))
                                 for _ in range(rng.randint(1, 6))))
    return "".join(parts)


def test_kept_answers_equal_the_tokenizers_own_for_random_texts(smollm_tokenizer) -> None:
    rng = random.Random(30)
    texts = list(dict.fromkeys(_text(rng) for _ in range(600)))
    kept, fresh = _own(smollm_tokenizer), _own(smollm_tokenizer)
    for text in texts:
        for allow_special in (False, True):
            first = kept.encode(text, allow_special=allow_special)
            again = kept.encode(text, allow_special=allow_special)
            want = fresh.encode(text, allow_special=allow_special)  # each text once: never kept
            assert first == again == want, (text, allow_special)
    assert len(kept.backend.encodes) == len(fresh.backend.encodes) == 2 * len(texts)
    for special in SPECIAL:  # the special token's text differs: its id, or its characters spelled
        on = kept.encode(special, allow_special=True)
        off = kept.encode(special, allow_special=False)
        assert len(on) == 1 and on[0] in smollm_tokenizer.special_ids
        assert len(off) > 1 and not set(off) & smollm_tokenizer.special_ids
        assert kept.encode(special, allow_special=True) == on
        assert kept.encode(special, allow_special=False) == off


def test_the_list_returned_is_the_callers_own(smollm_tokenizer) -> None:
    tokenizer = _own(smollm_tokenizer)
    text = "Hello <|im_start|> world"
    want = list(tokenizer.encode(text, allow_special=True))
    first = tokenizer.encode(text, allow_special=True)  # kept now
    first.append(7)
    first[0] = -1
    second = tokenizer.encode(text, allow_special=True)
    assert second == want
    second.clear()
    assert tokenizer.encode(text, allow_special=True) == want
    assert tokenizer.backend.encodes == [text]


def test_what_is_kept_stays_within_its_budget_the_oldest_going_first(smollm_tokenizer,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(tokenizer_module, "ENCODED_BYTES", 2000)
    monkeypatch.setattr(tokenizer_module, "ENCODED_TEXT_CHARS", 40)
    rng = random.Random(7)
    tokenizer = _own(smollm_tokenizer)
    texts = [f"{i:03d}" + "x" * rng.randint(0, 35) for i in range(60)]
    for text in texts:
        tokenizer.encode(text, allow_special=True)
    # What is kept is the newest texts: asked newest first, each answered without the backend until
    # the first that is not (asking for that one drops only older ones).
    calls = len(tokenizer.backend.encodes)
    kept = []
    for text in reversed(texts):
        tokenizer.encode(text, allow_special=True)
        if len(tokenizer.backend.encodes) > calls:
            break
        kept.append(text)
    def cost(text: str) -> int:
        return tokenizer_module.kept_cost(text, tuple(smollm_tokenizer.encode(
            text, allow_special=True)))

    held = sum(map(cost, kept))
    assert held <= 2000
    assert held + cost(texts[-len(kept) - 1]) > 2000  # as many as fit were kept
    long = "y" * 41  # longer than a text kept
    tokenizer.encode(long, allow_special=True)
    tokenizer.encode(long, allow_special=True)
    assert tokenizer.backend.encodes[-2:] == [long, long]


@pytest.mark.parametrize("allow_special", [False, True])
def test_an_empty_text_is_no_tokens(smollm_tokenizer, allow_special) -> None:
    tokenizer = _own(smollm_tokenizer)
    assert tokenizer.encode("", allow_special=allow_special) == []
    assert tokenizer.backend.encodes == []
