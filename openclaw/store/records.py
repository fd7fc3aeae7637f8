"""What the store hands back: frozen dataclasses (safe after the session closes) and the status enums.

Users are named by a key "channel:external_id" (`telegram:1001`, `discord:42`, `terminal:local`);
`user_key` and `parse_user_key` are the only places that know the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar


class UserStatus(StrEnum):
    ALLOWED = "allowed"
    PENDING = "pending"
    BLOCKED = "blocked"


class ConversationStatus(StrEnum):
    ACTIVE = "active"
    ARCHIVED = "archived"


class MessageRole(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class InboundStatus(StrEnum):
    RECEIVED = "received"
    PROCESSED = "processed"
    FAILED = "failed"


class OutboundStatus(StrEnum):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class ReminderStatus(StrEnum):
    ACTIVE = "active"  # waiting for its time (a repeating one stays active)
    DONE = "done"  # delivered, and it does not repeat
    CANCELLED = "cancelled"


class JobStatus(StrEnum):
    ACTIVE = "active"  # scheduled
    PAUSED = "paused"  # kept, not fired until resumed
    DONE = "done"  # a one-off that ran
    CANCELLED = "cancelled"


class JobKind(StrEnum):
    REMINDER = "reminder"  # delivers its text
    AGENT = "agent"  # runs its text as a prompt, delivers the answer
    HEARTBEAT = "heartbeat"  # an agent job over the user's checklist


class StoreUnavailableError(RuntimeError):
    """The database could not be opened or migrated; the message says which and what to check."""


class UnknownUserError(LookupError):
    """A method needs a users row that does not exist yet (call `Store.ensure_user` first)."""


def user_key(channel: str, external_id: str | int) -> str:
    return f"{channel}:{external_id}"


def parse_user_key(user: str) -> tuple[str, str]:
    """Split "channel:external_id"; the id may itself contain ':' (only the first one separates)."""
    channel, sep, external_id = str(user).partition(":")
    if not sep or not channel or not external_id:
        raise ValueError(f"user {user!r} is not of the form 'channel:id' (e.g. 'telegram:1001')")
    return channel, external_id


@dataclass(frozen=True, slots=True)
class User:
    id: int
    channel: str
    external_id: str
    display_name: str | None
    status: UserStatus
    role: str | None
    created_at: datetime
    updated_at: datetime
    admin: bool = False  # an owner, by `openclaw pairing approve --admin`
    private: bool = False  # `/private on`: their turns are not traced (openclaw/traces)

    @property
    def key(self) -> str:
        return user_key(self.channel, self.external_id)


@dataclass(frozen=True, slots=True)
class PairingCode:
    code: str
    user_id: int
    user: str
    display_name: str | None
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None
    chat_id: str | None = None  # where they asked; kept until the welcome is taken
    message: str | None = None  # their first message, kept to be answered once approved


@dataclass(frozen=True, slots=True)
class PairingRequest:
    """What a stranger's request for access got: their code (None: refused, or no longer a
    stranger), and whether it is new (the owner is told of a new one only)."""

    code: str | None
    new: bool = False


class PairingRefusalReason(StrEnum):
    USER_RATE = "user_rate"  # this stranger had their codes for the day
    OVERALL_RATE = "overall_rate"  # everyone's codes for the hour were given out


@dataclass(frozen=True, slots=True)
class PairingLimits:
    """How many pairing codes are given out, and how long one lives. Counted per stranger over a
    day and for everyone over an hour, so that a few strangers asking again and again can neither
    hold every code nor take turns taking a newcomer's."""

    pending: int = 3  # codes waiting at once; a newcomer's replaces one (Store.create_pairing_code)
    per_user: int = 3  # codes one stranger gets in `per_user_window_s`
    overall: int = 12  # codes everyone gets in `overall_window_s`
    ttl_s: float = 3600
    per_user_window_s: ClassVar[float] = 86400
    overall_window_s: ClassVar[float] = 3600
    # What the owner is shown of refused requests: the strangers refused last, for a week.
    keep_refused: ClassVar[int] = 100
    keep_refused_s: ClassVar[float] = 7 * 86400


@dataclass(frozen=True, slots=True)
class PairingRefusal:
    """A stranger's requests for a pairing code that were refused, counted."""

    user: str
    display_name: str | None
    reason: PairingRefusalReason  # of the latest one
    count: int
    first_at: datetime
    last_at: datetime

    @property
    def channel(self) -> str:
        return parse_user_key(self.user)[0]


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    user_id: int
    channel: str
    chat_id: str
    status: ConversationStatus
    created_at: datetime
    updated_at: datetime
    archived_at: datetime | None


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    conversation_id: int
    role: MessageRole
    content: str
    tool_calls: Any | None
    tool_call_id: str | None
    token_count: int | None
    created_at: datetime
    prompt_version: str | None = None  # on assistant messages: see openclaw.prompts' labels

    def as_chat(self) -> dict[str, Any]:
        """The OpenAI-style message dict the chat template takes."""
        out: dict[str, Any] = {"role": str(self.role), "content": self.content}
        if self.tool_calls is not None:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True, slots=True)
class InboundEvent:
    id: int
    channel: str
    message_id: str
    user: str
    chat_id: str
    text: str
    payload: Any | None
    status: InboundStatus
    error: str | None
    received_at: datetime
    processed_at: datetime | None


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    id: int
    conversation_id: int | None
    inbound_event_id: int | None
    channel: str
    chat_id: str
    text: str
    status: OutboundStatus
    attempts: int
    external_message_id: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None


@dataclass(frozen=True, slots=True)
class Summary:
    id: int
    conversation_id: int
    up_to_message_id: int
    content: str
    token_count: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: datetime
    user: str
    skill: str
    arguments: Any | None
    decision: str
    exit_status: int | None
    duration_ms: int | None
    output_bytes: int | None
    detail: str | None


@dataclass(frozen=True, slots=True)
class Reminder:
    id: int  # internal: the scheduler's and the logs'; never shown to users
    number: int  # what its user sees and types: 1, 2, 3... per user, never reused
    user: str
    channel: str
    chat_id: str
    text: str
    due_at: datetime  # the next time it fires (UTC)
    repeat: str | None  # None, "daily", "weekdays" or "weekly", in wall-clock time of `timezone`
    timezone: str  # IANA name the user's times were meant in
    # The wall-clock time meant ("02:30:00"), which repeats keep: due_at alone loses it on a day
    # when that time does not exist (a DST gap) and the reminder fires an hour later.
    local_time: str
    status: ReminderStatus
    fired_count: int
    created_at: datetime
    fired_at: datetime | None  # the last delivery


@dataclass(frozen=True, slots=True)
class MovedChat:
    """What `Store.move_chat` moved to the chat's new id."""

    conversations: list[Conversation]
    outbound: list[OutboundMessage]  # replies still pending, oldest first
    reminders: list[Reminder]


@dataclass(frozen=True, slots=True)
class Welcome:
    """An approved stranger to tell they are in (the piece saying so is stored for the outbox),
    and the message they asked with, now an inbound event to answer (None: none was kept)."""

    channel: str
    chat_id: str
    event: InboundEvent | None


@dataclass(frozen=True, slots=True)
class Job:
    """A scheduled job a user (or the config's [[jobs]]) asked for; the scheduler's job store
    holds only its trigger."""

    id: int  # internal: the scheduler's key ("job:ID") and the logs'
    number: int  # what its user sees and types, per user, never reused
    user: str
    channel: str
    chat_id: str
    kind: JobKind
    schedule: str  # as openclaw.scheduler.triggers reads it: "once ISO", "cron M H D M W", "every Ns"
    timezone: str  # IANA name the schedule is meant in
    text: str  # a reminder's text, an agent job's prompt
    options: dict[str, Any] | None  # kind-specific (an agent job's "only_if_needed")
    status: JobStatus
    config_name: str | None  # a [[jobs]] entry's name: the config owns it, not the user
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class JobRun:
    """One firing of a job for one due time, recorded before it starts."""

    id: int
    job_id: int
    due_at: datetime
    started_at: datetime
    finished_at: datetime | None
    outcome: str  # "running", then "delivered", "silent", "missed", "failed" or "interrupted"
