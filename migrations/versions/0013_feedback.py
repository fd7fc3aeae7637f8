"""Feedback: a user's grade of one reply of ours (issue 29's data flywheel).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07

`feedback` holds one row per (grader, turn, source): the turn is the inbound event whose reply is
graded (deleted with it), `kind` good / bad / retry, `source` reaction / command / text. A later
grade of the same turn from the same source replaces the earlier one (the unique index).

An index on outbound_messages (channel, external_message_id) finds the turn a reaction names: the
service gives the id of the message reacted to, one of the pieces of our reply.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "feedback",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("inbound_event_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_feedback"),
        sa.ForeignKeyConstraint(["inbound_event_id"], ["inbound_events.id"],
                                name="fk_feedback_inbound_event_id_inbound_events",
                                ondelete="CASCADE"),
        sa.UniqueConstraint("user_key", "inbound_event_id", "source",
                            name="uq_feedback_user_key_inbound_event_id_source"),
        sa.CheckConstraint("kind IN ('good', 'bad', 'retry')", name=op.f("ck_feedback_kind")),
        sa.CheckConstraint("source IN ('reaction', 'command', 'text')", name=op.f("ck_feedback_source")),
    )
    op.create_index("ix_feedback_inbound_event_id", "feedback", ["inbound_event_id"])
    op.create_index("ix_outbound_messages_channel_external_message_id", "outbound_messages",
                    ["channel", "external_message_id"])


def downgrade() -> None:
    op.drop_index("ix_outbound_messages_channel_external_message_id", "outbound_messages")
    op.drop_table("feedback")
