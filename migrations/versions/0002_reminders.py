"""Reminders: what a user asked to be reminded of, when, in which chat, and whether it repeats.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "reminders",
        sa.Column("id", ID, primary_key=True),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("chat_id", sa.String(128), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("due_at", TS, nullable=False),
        sa.Column("repeat", sa.String(16), nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("local_time", sa.String(15), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("fired_count", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("fired_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_reminders"),
        sa.CheckConstraint("status IN ('active', 'done', 'cancelled')",
                           name=op.f("ck_reminders_status")),
    )
    op.create_index("ix_reminders_status_due_at", "reminders", ["status", "due_at"])
    op.create_index("ix_reminders_user_key_status", "reminders", ["user_key", "status"])


def downgrade() -> None:
    op.drop_table("reminders")
