"""Initial schema: users, pairing codes, conversations, messages, inbound/outbound, summaries, audit, usage.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand and frozen: later changes go in new revisions, never here. Types are spelled out
rather than imported from openclaw.store.models, so this file keeps meaning what it meant.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)
ACTIVE = sa.text("status = 'active'")


def _id() -> sa.Column:
    return sa.Column("id", ID, primary_key=True)


def _check(table: str, column: str, values: tuple[str, ...]) -> sa.CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    # op.f: the name is final; the naming convention must not prefix it again.
    return sa.CheckConstraint(f"{column} IN ({listed})", name=op.f(f"ck_{table}_{column}"))


def _fk(table: str, column: str, target: str, ondelete: str, nullable: bool = False) -> sa.Column:
    return sa.Column(column, ID, sa.ForeignKey(f"{target}.id", ondelete=ondelete,
                                               name=f"fk_{table}_{column}_{target}"),
                     nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "users",
        _id(),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("external_id", sa.String(128), nullable=False),
        sa.Column("display_name", sa.String(256), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("role", sa.String(64), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("channel", "external_id", name="uq_users_channel_external_id"),
        _check("users", "status", ("allowed", "pending", "blocked")),
    )
    op.create_table(
        "pairing_codes",
        _id(),
        sa.Column("code", sa.String(16), nullable=False),
        _fk("pairing_codes", "user_id", "users", "CASCADE"),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("used_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_pairing_codes"),
        sa.UniqueConstraint("code", name="uq_pairing_codes_code"),
    )
    op.create_index("ix_pairing_codes_user_id", "pairing_codes", ["user_id"])
    op.create_index("ix_pairing_codes_expires_at", "pairing_codes", ["expires_at"])

    op.create_table(
        "conversations",
        _id(),
        _fk("conversations", "user_id", "users", "CASCADE"),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("chat_id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("archived_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_conversations"),
        _check("conversations", "status", ("active", "archived")),
    )
    op.create_index("ix_conversations_user_id_chat_id", "conversations", ["user_id", "chat_id"])
    # At most one active conversation per (user, channel, chat): a partial unique index.
    op.create_index("uq_conversations_active", "conversations", ["user_id", "channel", "chat_id"],
                    unique=True, sqlite_where=ACTIVE, postgresql_where=ACTIVE)

    op.create_table(
        "messages",
        _id(),
        _fk("messages", "conversation_id", "conversations", "CASCADE"),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("tool_calls", sa.JSON(), nullable=True),
        sa.Column("tool_call_id", sa.String(255), nullable=True),
        sa.Column("token_count", sa.Integer(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_messages"),
        _check("messages", "role", ("system", "user", "assistant", "tool")),
    )
    op.create_index("ix_messages_conversation_id_id", "messages", ["conversation_id", "id"])

    op.create_table(
        "inbound_events",
        _id(),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("chat_id", sa.String(128), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("received_at", TS, nullable=False),
        sa.Column("processed_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_inbound_events"),
        sa.UniqueConstraint("channel", "message_id", name="uq_inbound_events_channel_message_id"),
        _check("inbound_events", "status", ("received", "processed", "failed")),
    )
    op.create_index("ix_inbound_events_status_id", "inbound_events", ["status", "id"])

    op.create_table(
        "outbound_messages",
        _id(),
        _fk("outbound_messages", "conversation_id", "conversations", "SET NULL", nullable=True),
        _fk("outbound_messages", "inbound_event_id", "inbound_events", "SET NULL", nullable=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("chat_id", sa.String(128), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("external_message_id", sa.String(128), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("sent_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbound_messages"),
        _check("outbound_messages", "status", ("pending", "sent", "failed")),
    )
    op.create_index("ix_outbound_messages_status_id", "outbound_messages", ["status", "id"])
    op.create_index("ix_outbound_messages_conversation_id", "outbound_messages", ["conversation_id"])
    op.create_index("ix_outbound_messages_inbound_event_id", "outbound_messages", ["inbound_event_id"])

    op.create_table(
        "summaries",
        _id(),
        _fk("summaries", "conversation_id", "conversations", "CASCADE"),
        sa.Column("up_to_message_id", ID, nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_summaries"),
    )
    op.create_index("ix_summaries_conversation_id_up_to_message_id", "summaries",
                    ["conversation_id", "up_to_message_id"])

    op.create_table(
        "audit_log",
        _id(),
        sa.Column("at", TS, nullable=False),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("skill", sa.String(128), nullable=False),
        sa.Column("arguments", sa.JSON(), nullable=True),
        sa.Column("decision", sa.String(32), nullable=False),
        sa.Column("exit_status", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column("output_bytes", sa.BigInteger(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_user_key_id", "audit_log", ["user_key", "id"])

    op.create_table(
        "usage",
        _id(),
        sa.Column("at", TS, nullable=False),
        sa.Column("user_key", sa.String(160), nullable=False),
        _fk("usage", "conversation_id", "conversations", "SET NULL", nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage"),
    )
    op.create_index("ix_usage_user_key_at", "usage", ["user_key", "at"])
    op.create_index("ix_usage_at", "usage", ["at"])


def downgrade() -> None:
    for table in ("usage", "audit_log", "summaries", "outbound_messages", "inbound_events", "messages",
                  "conversations", "pairing_codes", "users"):
        op.drop_table(table)
