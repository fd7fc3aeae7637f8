"""The store's tables as SQLAlchemy ORM classes; the schema itself is created by migrations/.

These classes stay inside `openclaw.store`: the Store turns rows into the frozen records of
`records.py` before returning them. Types are chosen to mean the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from openclaw.store.columns import (
    EnumText,
    FreeString,
    FreeText,
    Id,
    Json,
    UTCDateTime,
    one_of,
)
from openclaw.store.feedback_records import FeedbackKind, FeedbackSource
from openclaw.store.memory_records import MemoryKind
from openclaw.store.records import (
    ConversationStatus,
    InboundStatus,
    JobKind,
    JobStatus,
    MessageRole,
    OutboundStatus,
    PairingRefusalReason,
    ReminderStatus,
    UserStatus,
)
from openclaw.store.trace_records import TraceStatus

# Explicit names keep constraints addressable by later migrations (SQLite batch mode needs them).
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

AUDIT_SKILL_CHARS = 128  # the audit's skill column: Store.add_audit cuts a longer name to it

class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class UserRow(Base):
    __tablename__ = "users"
    __table_args__ = (
        UniqueConstraint("channel", "external_id"),
        one_of("status", UserStatus),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    channel: Mapped[str] = mapped_column(String(32))
    external_id: Mapped[str] = mapped_column(String(128))
    display_name: Mapped[str | None] = mapped_column(FreeString(256))
    status: Mapped[UserStatus] = mapped_column(EnumText(UserStatus))
    role: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # An owner (answers pairing requests) by `openclaw pairing approve --admin`; the config's
    # lists decide instead for the users they name (gateway/access.py).
    admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # `/private on`: their turns are not traced (openclaw/traces), so never exported.
    private: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class PairingCodeRow(Base):
    __tablename__ = "pairing_codes"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    code: Mapped[str] = mapped_column(String(16), unique=True)
    user_id: Mapped[int] = mapped_column(Id, ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Where the stranger asked, and their first message (cut to KEPT_MESSAGE_CHARS): kept for
    # the welcome once the code is approved (Store.take_welcomes), cleared once it is taken or
    # the code denied.
    chat_id: Mapped[str | None] = mapped_column(String(128))
    message: Mapped[str | None] = mapped_column(FreeText)


class PairingIssuedRow(Base):
    """One pairing code given out: what the rates count. Kept a day (the longest window), apart
    from the codes, which go when they expire or their user is forgotten."""

    __tablename__ = "pairing_issued"
    __table_args__ = (Index("ix_pairing_issued_user_key_at", "user_key", "at"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    user: Mapped[str] = mapped_column("user_key", String(160))
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class PairingRefusalRow(Base):
    """A stranger's refused requests for a code, one row each, counted (PairingLimits bounds
    how many rows and for how long)."""

    __tablename__ = "pairing_refusals"
    __table_args__ = (one_of("reason", PairingRefusalReason),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    user: Mapped[str] = mapped_column("user_key", String(160), unique=True)
    reason: Mapped[PairingRefusalReason] = mapped_column(EnumText(PairingRefusalReason))
    count: Mapped[int] = mapped_column(Integer)
    first_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class ConversationRow(Base):
    __tablename__ = "conversations"
    __table_args__ = (
        one_of("status", ConversationStatus),
        Index("ix_conversations_user_id_chat_id", "user_id", "chat_id"),
        # At most one active conversation per (user, channel, chat); the Store also checks first.
        Index(
            "uq_conversations_active", "user_id", "channel", "chat_id", unique=True,
            sqlite_where=text("status = 'active'"), postgresql_where=text("status = 'active'"),
        ),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    user_id: Mapped[int] = mapped_column(Id, ForeignKey("users.id", ondelete="CASCADE"))
    channel: Mapped[str] = mapped_column(String(32))
    chat_id: Mapped[str] = mapped_column(String(128))
    status: Mapped[ConversationStatus] = mapped_column(EnumText(ConversationStatus))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    archived_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class MessageRow(Base):
    __tablename__ = "messages"
    __table_args__ = (
        one_of("role", MessageRole),
        Index("ix_messages_conversation_id_id", "conversation_id", "id"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(Id, ForeignKey("conversations.id", ondelete="CASCADE"))
    role: Mapped[MessageRole] = mapped_column(EnumText(MessageRole))
    content: Mapped[str] = mapped_column(FreeText)
    tool_calls: Mapped[Any | None] = mapped_column(Json)
    tool_call_id: Mapped[str | None] = mapped_column(String(255))
    token_count: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # On assistant messages: the prompt versions it was answered with (openclaw.prompts' label).
    prompt_version: Mapped[str | None] = mapped_column(String(160))


class InboundEventRow(Base):
    __tablename__ = "inbound_events"
    __table_args__ = (
        # The dedupe key: a redelivered update must not be answered twice.
        UniqueConstraint("channel", "message_id"),
        one_of("status", InboundStatus),
        Index("ix_inbound_events_status_id", "status", "id"),
        Index("ix_inbound_events_status_processed_at", "status", "processed_at"),  # retention.py's age limit
        Index("ix_inbound_events_user_key", "user_key"),  # forget_user
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    channel: Mapped[str] = mapped_column(String(32))
    message_id: Mapped[str] = mapped_column(String(128))
    user: Mapped[str] = mapped_column("user_key", String(160))
    chat_id: Mapped[str] = mapped_column(String(128))
    text: Mapped[str] = mapped_column(FreeText)
    payload: Mapped[Any | None] = mapped_column(Json)
    status: Mapped[InboundStatus] = mapped_column(EnumText(InboundStatus))
    error: Mapped[str | None] = mapped_column(FreeText)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())
    processed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class OutboundMessageRow(Base):
    __tablename__ = "outbound_messages"
    __table_args__ = (
        one_of("status", OutboundStatus),
        Index("ix_outbound_messages_status_id", "status", "id"),
        Index("ix_outbound_messages_status_updated_at", "status", "updated_at"),  # retention.py's age limit
        # One chat's replies: its pending ones in order (pending_outbound, move_chat), all of them
        # (forget_user).
        Index("ix_outbound_messages_channel_chat_id_status_id", "channel", "chat_id", "status", "id"),
        # The turn a reaction names by the id the service gave the reacted piece (feedback.py).
        Index("ix_outbound_messages_channel_external_message_id", "channel", "external_message_id"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    conversation_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("conversations.id", ondelete="SET NULL"), index=True)
    inbound_event_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("inbound_events.id", ondelete="SET NULL"), index=True)
    channel: Mapped[str] = mapped_column(String(32))
    chat_id: Mapped[str] = mapped_column(String(128))
    text: Mapped[str] = mapped_column(FreeText)
    status: Mapped[OutboundStatus] = mapped_column(EnumText(OutboundStatus))
    attempts: Mapped[int] = mapped_column(Integer)
    external_message_id: Mapped[str | None] = mapped_column(String(128))
    error: Mapped[str | None] = mapped_column(FreeText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class SummaryRow(Base):
    __tablename__ = "summaries"
    __table_args__ = (Index("ix_summaries_conversation_id_up_to_message_id", "conversation_id",
                            "up_to_message_id"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(Id, ForeignKey("conversations.id", ondelete="CASCADE"))
    up_to_message_id: Mapped[int] = mapped_column(Id)
    content: Mapped[str] = mapped_column(FreeText)
    token_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AuditRow(Base):
    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_user_key_id", "user_key", "id"),
        Index("ix_audit_log_at", "at"),  # retention.py's age limit
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    user: Mapped[str] = mapped_column("user_key", String(160))
    skill: Mapped[str] = mapped_column(FreeString(AUDIT_SKILL_CHARS))  # the model's name, made up too
    arguments: Mapped[Any | None] = mapped_column(Json)
    decision: Mapped[str] = mapped_column(String(32))
    exit_status: Mapped[int | None] = mapped_column(Integer)
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    output_bytes: Mapped[int | None] = mapped_column(BigInteger)
    detail: Mapped[str | None] = mapped_column(FreeText)


class UsageRow(Base):
    """One row per model call; "tokens today" is a SUM over a day, so concurrent writers never collide."""

    __tablename__ = "usage"
    __table_args__ = (
        Index("ix_usage_user_key_at", "user_key", "at"),
        Index("ix_usage_at", "at"),
        Index("ix_usage_conversation_id", "conversation_id"),  # a deleted conversation unlinks
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    user: Mapped[str] = mapped_column("user_key", String(160))
    conversation_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("conversations.id", ondelete="SET NULL"))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)


class ReminderRow(Base):
    __tablename__ = "reminders"
    __table_args__ = (
        one_of("status", ReminderStatus),
        Index("ix_reminders_status_due_at", "status", "due_at"),  # the scheduler's next-due query
        Index("ix_reminders_user_key_status", "user_key", "status"),  # a user's list
        # Two adds at once for one user must not both take the next number.
        UniqueConstraint("user_key", "number"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    number: Mapped[int] = mapped_column(Integer)  # per user; see Store.add_reminder
    user: Mapped[str] = mapped_column("user_key", String(160))
    channel: Mapped[str] = mapped_column(String(32))
    chat_id: Mapped[str] = mapped_column(String(128))
    text: Mapped[str] = mapped_column(FreeText)
    due_at: Mapped[datetime] = mapped_column(UTCDateTime())
    repeat: Mapped[str | None] = mapped_column(String(16))
    timezone: Mapped[str] = mapped_column(String(64))
    local_time: Mapped[str] = mapped_column(String(15))
    status: Mapped[ReminderStatus] = mapped_column(EnumText(ReminderStatus))
    fired_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class McpServerRow(Base):
    """An MCP server whose tool list was seen (skills/mcp/trust.py): a row here means its first
    list is pinned, so a later tool is new, not a first sight."""

    __tablename__ = "mcp_servers"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    trusted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class McpToolRow(Base):
    """One tool of an MCP server: the fingerprint the admin trusts (`pinned`) and the one last
    listed (`seen`, None once the server stopped listing it), with a cleaned preview of its
    description for `openclaw mcp list`."""

    __tablename__ = "mcp_tools"
    __table_args__ = (UniqueConstraint("server_id", "name"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    server_id: Mapped[int] = mapped_column(Id, ForeignKey("mcp_servers.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    pinned: Mapped[str | None] = mapped_column(String(80))
    seen: Mapped[str | None] = mapped_column(String(80))
    note: Mapped[str | None] = mapped_column(FreeText)


class MemoryRow(Base):
    """One entry of a user's long-term memory (openclaw/store/memory.py). Its full-text index
    lives beside it, outside these models: memories_fts (FTS5) on SQLite, a GIN expression index
    on PostgreSQL (migration 0010)."""

    __tablename__ = "memories"
    __table_args__ = (
        one_of("kind", MemoryKind),
        Index("ix_memories_user_key_scope_digest", "user_key", "scope", "digest"),  # duplicates
        Index("ix_memories_user_key_pinned_created_at", "user_key", "pinned", "created_at"),
        UniqueConstraint("user_key", "number"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    number: Mapped[int] = mapped_column(Integer)
    user: Mapped[str] = mapped_column("user_key", String(160))
    scope: Mapped[str] = mapped_column(String(160))
    kind: Mapped[MemoryKind] = mapped_column(EnumText(MemoryKind))
    text: Mapped[str] = mapped_column(FreeText)
    digest: Mapped[str] = mapped_column(String(64))  # of the text as compared for duplicates
    source: Mapped[str | None] = mapped_column(String(2000))
    pinned: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class MemorySettingRow(Base):
    """A user's `/memory off`: a row exists while their memory is off."""

    __tablename__ = "memory_off"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    user: Mapped[str] = mapped_column("user_key", String(160), unique=True)
    since: Mapped[datetime] = mapped_column(UTCDateTime())


def in_models(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Alembic's `include_name`: the memories' full-text index (memories_fts: FTS5 tables and
    triggers on SQLite, a GIN index on PostgreSQL) is made by migration 0010 outside the models."""
    return not (name or "").startswith("memories_fts")


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        one_of("status", JobStatus),
        one_of("kind", JobKind),
        Index("ix_jobs_user_key_status", "user_key", "status"),  # a user's list, their cap
        UniqueConstraint("user_key", "number"),  # as reminders: two adds take two numbers
        UniqueConstraint("config_name"),  # a [[jobs]] entry is one job, never two
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    number: Mapped[int] = mapped_column(Integer)
    user: Mapped[str] = mapped_column("user_key", String(160))
    channel: Mapped[str] = mapped_column(String(32))
    chat_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[JobKind] = mapped_column(EnumText(JobKind))
    schedule: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(FreeText)
    options: Mapped[dict[str, Any] | None] = mapped_column(Json)
    status: Mapped[JobStatus] = mapped_column(EnumText(JobStatus))
    config_name: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobRunRow(Base):
    __tablename__ = "job_runs"
    # One run per job and due time: the row is written before the run starts, so a second firing
    # for the same time (a restart, a crash mid-run) finds it and does nothing.
    __table_args__ = (UniqueConstraint("job_id", "due_at"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    job_id: Mapped[int] = mapped_column(Id, ForeignKey("jobs.id", ondelete="CASCADE"))
    due_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    outcome: Mapped[str] = mapped_column(String(16))


class HeartbeatRow(Base):
    """A user's heartbeat (openclaw/scheduler/heartbeat.py): whether it runs, how often, where it
    speaks, their quiet hours, and the checklist set with /heartbeat edit (None: HEARTBEAT.md)."""

    __tablename__ = "heartbeats"
    __table_args__ = (UniqueConstraint("user_key"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    user: Mapped[str] = mapped_column("user_key", String(160))
    enabled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    every_minutes: Mapped[int] = mapped_column(Integer)
    channel: Mapped[str] = mapped_column(String(32))
    chat_id: Mapped[str] = mapped_column(String(128))
    quiet_start: Mapped[str | None] = mapped_column(String(5))  # "22:00", in `timezone`
    quiet_end: Mapped[str | None] = mapped_column(String(5))
    timezone: Mapped[str] = mapped_column(String(64))
    checklist: Mapped[str | None] = mapped_column(FreeText)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class TraceRow(Base):
    """One agent turn (openclaw/store/traces.py): what produced it, how it went, and where its
    messages are (first_message_id..last_message_id of its conversation). Goes with its
    conversation; outlives the journal row of the message it answered."""

    __tablename__ = "traces"
    __table_args__ = (one_of("status", TraceStatus), UniqueConstraint("inbound_event_id"))

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    inbound_event_id: Mapped[int | None] = mapped_column(
        Id, ForeignKey("inbound_events.id", ondelete="SET NULL"))
    user: Mapped[str] = mapped_column("user_key", String(160), index=True)
    conversation_id: Mapped[int] = mapped_column(
        Id, ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    first_message_id: Mapped[int | None] = mapped_column(Id)
    last_message_id: Mapped[int | None] = mapped_column(Id)
    prompt_version: Mapped[str] = mapped_column(String(160))
    model: Mapped[str] = mapped_column(FreeString(256))
    sampling: Mapped[dict[str, Any] | None] = mapped_column(Json)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    duration_ms: Mapped[int] = mapped_column(Integer)
    first_token_ms: Mapped[int | None] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    tool_calls: Mapped[int] = mapped_column(Integer)
    tool_errors: Mapped[int] = mapped_column(Integer)
    last_tool_failed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    reply_chars: Mapped[int] = mapped_column(Integer)
    status: Mapped[TraceStatus] = mapped_column(EnumText(TraceStatus))


class FeedbackRow(Base):
    """A user's grade of the reply to one turn (openclaw/store/feedback.py): a later one from the
    same source replaces it; it goes with the turn's inbound event."""

    __tablename__ = "feedback"
    __table_args__ = (
        UniqueConstraint("user_key", "inbound_event_id", "source"),
        one_of("kind", FeedbackKind),
        one_of("source", FeedbackSource),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    user: Mapped[str] = mapped_column("user_key", String(160))
    inbound_event_id: Mapped[int] = mapped_column(
        Id, ForeignKey("inbound_events.id", ondelete="CASCADE"), index=True)
    kind: Mapped[FeedbackKind] = mapped_column(EnumText(FeedbackKind))
    source: Mapped[FeedbackSource] = mapped_column(EnumText(FeedbackSource))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
class PromptVersionRow(Base):
    """One version of a named prompt (openclaw/store/prompts.py); immutable once stored."""

    __tablename__ = "prompt_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(32))
    text: Mapped[str] = mapped_column(FreeText)
    author: Mapped[str] = mapped_column(FreeString(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    parent_id: Mapped[int | None] = mapped_column(Id, ForeignKey("prompt_versions.id"))


class PromptSettingRow(Base):
    """A prompt name's active version and, while an A/B test runs, its variants' weights."""

    __tablename__ = "prompt_settings"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    active: Mapped[str | None] = mapped_column(String(32))
    variants: Mapped[dict[str, int] | None] = mapped_column(Json)


class PromptPinRow(Base):
    """A user given one version of a prompt name, before any A/B split or active version."""

    __tablename__ = "prompt_pins"

    user: Mapped[str] = mapped_column("user_key", String(160), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(32))
