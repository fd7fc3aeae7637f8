"""Traces: one row per agent turn, kept to grade the turn and to export it for fine-tuning.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

`traces` records each agent turn once, after its reply is handed to the outbox: the turn's
messages (the range first_message_id..last_message_id of its conversation), the prompt versions,
model and sampling that produced it, its timings, steps, tool calls and errors, and how it ended.
The messages themselves stay in `messages`; a trace only points at them. `inbound_event_id` is
null for a scheduled job's turn.

`inbound_event_id` is set null when the journal row goes (retention); the trace goes with its
conversation.

`users.private`: a user's `/private on`; their turns are not traced and never exported.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "traces",
        sa.Column("id", ID, primary_key=True),
        sa.Column("inbound_event_id", ID, sa.ForeignKey(
            "inbound_events.id", ondelete="SET NULL", name="fk_traces_inbound_event_id_inbound_events"),
            nullable=True),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("conversation_id", ID, sa.ForeignKey(
            "conversations.id", ondelete="CASCADE", name="fk_traces_conversation_id_conversations"),
            nullable=False),
        sa.Column("first_message_id", ID, nullable=True),
        sa.Column("last_message_id", ID, nullable=True),
        sa.Column("prompt_version", sa.String(160), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("sampling", sa.JSON(), nullable=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("first_token_ms", sa.Integer(), nullable=True),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("tool_errors", sa.Integer(), nullable=False),
        sa.Column("last_tool_failed", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("reply_chars", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_traces"),
        sa.CheckConstraint("status IN ('answered', 'failed', 'stopped')",
                           name=op.f("ck_traces_status")),
        sa.UniqueConstraint("inbound_event_id", name="uq_traces_inbound_event_id"),
    )
    op.create_index("ix_traces_started_at", "traces", ["started_at"])
    op.create_index("ix_traces_user_key", "traces", ["user_key"])
    op.create_index("ix_traces_conversation_id", "traces", ["conversation_id"])
    op.add_column("users", sa.Column("private", sa.Boolean(), nullable=False,
                                     server_default=sa.false()))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+): a batch copy of `users` would cascade-delete its rows'
    # conversations (see 0007).
    op.drop_column("users", "private")
    op.drop_table("traces")
