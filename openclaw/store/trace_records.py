"""What the store hands back of the traces of agent turns (openclaw/store/traces.py): how a turn
ended, and the frozen trace."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class TraceStatus(StrEnum):
    ANSWERED = "answered"
    FAILED = "failed"  # the turn ended in an apology (an error, a prompt too long)
    STOPPED = "stopped"  # /stop, /new, or the step limit without a final answer


@dataclass(frozen=True, slots=True)
class Trace:
    """One agent turn: its messages are those of `conversation_id` from `first_message_id` to
    `last_message_id` (the user's message to the final reply); `inbound_event_id` is the message
    it answered (None for a scheduled job's turn)."""

    id: int
    inbound_event_id: int | None
    user: str
    conversation_id: int
    first_message_id: int | None
    last_message_id: int | None
    prompt_version: str
    model: str
    sampling: dict[str, Any] | None
    started_at: datetime
    duration_ms: int
    first_token_ms: int | None
    steps: int
    tool_calls: int
    tool_errors: int
    last_tool_failed: bool
    reply_chars: int
    status: TraceStatus
