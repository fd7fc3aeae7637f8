"""repeats' character-count bound (openclaw/feedback.py) only saves time: for random pairs and
near-duplicates (one character changed, words swapped, case and punctuation changed, exactly at
RETRY_SIMILARITY) it answers what the plain SequenceMatcher definition answers."""

from __future__ import annotations

import random
from difflib import SequenceMatcher

from openclaw.feedback import RETRY_MIN_CHARS, RETRY_SIMILARITY, normalized, repeats

WORDS = ("what", "time", "is", "it", "in", "tokyo", "paris", "now", "please", "tell", "me",
         "the", "weather", "tomorrow", "remind", "to", "call", "mum", "at", "six", "é", "ß")


def _repeats_by_definition(previous: str, text: str) -> bool:
    """The definition before the bound: similarity by SequenceMatcher alone."""
    a, b = normalized(previous), normalized(text)
    if min(len(a), len(b)) < RETRY_MIN_CHARS:
        return False
    return a == b or SequenceMatcher(None, a, b).ratio() >= RETRY_SIMILARITY


def _near(rng: random.Random, text: str) -> str:
    """`text` changed a little, one of the ways a user asks again."""
    words = text.split()
    way = rng.randrange(6)
    if way == 0 and text:  # one character changed
        i = rng.randrange(len(text))
        return text[:i] + rng.choice("abcxyz ?!") + text[i + 1:]
    if way == 1 and len(words) > 1:  # two words swapped
        i, j = rng.sample(range(len(words)), 2)
        words[i], words[j] = words[j], words[i]
        return " ".join(words)
    if way == 2:  # case and punctuation
        return text.upper() + rng.choice(("?", "!!", " :)", "..."))
    if way == 3 and words:  # a word dropped or added
        return " ".join(words[:-1]) if rng.random() < 0.5 else f"{text} {rng.choice(WORDS)}"
    if way == 4 and text:  # a few characters changed
        chars = list(text)
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(len(chars))] = rng.choice("qwertyuiop")
        return "".join(chars)
    return "".join(rng.choice("abc .,'") + c for c in text[: rng.randint(0, 12)]) + text


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))


def test_repeats_answers_what_the_sequencematcher_definition_answers() -> None:
    rng = random.Random(30)
    pairs = [("abcdefghij", "abcdefghiX"),  # ratio exactly 0.9: 2*9/20
             ("what time is it", "what time is it?"), ("ABCDEFGHIJ", "abcdefghij!")]
    for _ in range(3000):
        a = _sentence(rng)
        pairs.append((a, _near(rng, a)))
        pairs.append((a, _near(rng, _near(rng, a))))
        pairs.append((a, _sentence(rng)))
        alphabet = rng.choice(("ab", "abc ", "xyzé", "".join(map(chr, range(32, 600)))))
        length = rng.randint(0, 30)
        x = "".join(rng.choice(alphabet) for _ in range(length))
        pairs.append((x, "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))))
        pairs.append((x, _near(rng, x)))
    answers = [(repeats(a, b), _repeats_by_definition(a, b), a, b) for a, b in pairs]
    differ = [(a, b) for got, want, a, b in answers if got != want]
    assert differ == []
    # Both answers are common, the near misses among them: the bound is tried on both sides.
    assert sum(got for got, *_ in answers) > len(pairs) // 10
    assert sum(not got for got, *_ in answers) > len(pairs) // 10
    ratios = [SequenceMatcher(None, normalized(a), normalized(b)).ratio() for a, b in pairs]
    assert sum(RETRY_SIMILARITY - 0.05 <= r < RETRY_SIMILARITY for r in ratios) > 100
    assert sum(r == RETRY_SIMILARITY for r in ratios) >= 1
