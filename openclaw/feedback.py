"""Feedback on our replies, the grades issue 29's traces are sorted by: what a user's 👍 / 👎,
/good / /bad, repeated message or "that's wrong" means, and the grades each turn got.

A grade is for one turn (its inbound event), the one whose reply it reacts to; the store keeps
one per grader, turn and source (openclaw/store/feedback.py). The gateway's side (reactions,
the commands, the check of each new message) is openclaw/gateway/feedback.py.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from difflib import SequenceMatcher

from openclaw.store import Store
from openclaw.store.feedback_records import FeedbackKind


async def feedback_of(store: Store, inbound_event_ids: Iterable[int]) -> dict[int, list[str]]:
    """The kinds of grade ("good", "bad", "retry") each turn got, oldest first; a turn with
    none is left out."""
    return await store.feedback_kinds(inbound_event_ids)


# -- reactions ---------------------------------------------------------------------------------

# Skin tones (U+1F3FB-U+1F3FF) and the emoji presentation selector (U+FE0F) change only how a
# thumb looks; Discord and Slack-style clients also name it in words.
_LOOKS = re.compile("[\U0001F3FB-\U0001F3FF\uFE0F]")
_REACTIONS = {"👍": FeedbackKind.GOOD, "+1": FeedbackKind.GOOD, "thumbsup": FeedbackKind.GOOD,
              "thumbs_up": FeedbackKind.GOOD,
              "👎": FeedbackKind.BAD, "-1": FeedbackKind.BAD, "thumbsdown": FeedbackKind.BAD,
              "thumbs_down": FeedbackKind.BAD}


def reaction_kind(emoji: str) -> FeedbackKind | None:
    """The grade a reaction gives: 👍 (any skin tone, or named "+1" / "thumbsup") good, 👎 bad;
    None for every other emoji, which grades nothing."""
    return _REACTIONS.get(_LOOKS.sub("", emoji).strip().strip(":").lower())


# -- what a message says about the reply before it -----------------------------------------------

# A repeat is a retry only this soon after the message it repeats: later, asking the same again
# ("what's the weather?") is a new question, not a sign the answer failed.
RETRY_WINDOW = timedelta(minutes=10)
# Nor when shorter than this (normalized): "ok", "thanks", "yes" are said twice for other reasons.
RETRY_MIN_CHARS = 10
# Two messages this similar (difflib's ratio, of the normalized texts) are the same request: it
# lets a corrected typo ("waht is 2+2" -> "what is 2+2") count, while a changed word in a short
# question, usually a new request, stays under it.
RETRY_SIMILARITY = 0.9

# A whole message that only says the answer was wrong (normalized: see `normalized`). Matched
# whole, never searched for: "what's wrong with my code" is a question, not a grade.
SAYS_WRONG = frozenset({
    "wrong", "thats wrong", "that is wrong", "incorrect", "thats incorrect", "that is incorrect",
    "thats not right", "that is not right", "not right", "thats not it", "that is not it",
    "no thats not it", "no that is not it", "no thats wrong", "no wrong",
})


def normalized(text: str) -> str:
    """`text` for comparing what it says: case folded, apostrophes dropped ("that's" ->
    "thats"), other punctuation and symbols (emoji) made spaces, spaces collapsed."""
    text = re.sub(r"['’`]", "", text.casefold())
    return " ".join(re.sub(r"[^\w\s]|_", " ", text).split())


def says_wrong(text: str) -> bool:
    """Whether the message only says that the answer was wrong (SAYS_WRONG)."""
    return normalized(text) in SAYS_WRONG


def repeats(previous: str, text: str) -> bool:
    """Whether `text` asks again what `previous` asked (RETRY_MIN_CHARS, RETRY_SIMILARITY)."""
    a, b = normalized(previous), normalized(text)
    if min(len(a), len(b)) < RETRY_MIN_CHARS:
        return False
    if a == b:
        return True
    # The characters both hold bound the ratio from above (difflib's quick_ratio): a message
    # unlike the last, as most are, is told apart in a few microseconds, not tens.
    shared = sum((Counter(a) & Counter(b)).values())
    if 2 * shared < RETRY_SIMILARITY * (len(a) + len(b)):
        return False
    return SequenceMatcher(None, a, b).ratio() >= RETRY_SIMILARITY
