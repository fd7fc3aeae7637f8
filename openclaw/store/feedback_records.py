"""What the store keeps of a user's grade of one reply: its kind, where it came from, and the
frozen record (openclaw/store/feedback.py stores them; openclaw/feedback.py decides them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class FeedbackKind(StrEnum):
    GOOD = "good"
    BAD = "bad"
    RETRY = "retry"  # the user sent the same message again: the reply did not do


class FeedbackSource(StrEnum):
    REACTION = "reaction"  # 👍 / 👎 on the reply (Telegram, Discord)
    COMMAND = "command"  # /good, /bad
    TEXT = "text"  # a repeated message, or "that's wrong"


@dataclass(frozen=True, slots=True)
class Feedback:
    id: int
    user: str  # who graded: "channel:id"
    inbound_event_id: int  # the turn whose reply is graded
    kind: FeedbackKind
    source: FeedbackSource
    at: datetime
