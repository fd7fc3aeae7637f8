"""Heartbeats: per user, opt-in, an agent job over their checklist at an interval.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07

`heartbeats` holds one row per user who ever set theirs: on or off (off by default), every how
many minutes, the chat it speaks in, quiet hours (wall-clock "HH:MM" in `timezone`; none when
null) and the checklist given with /heartbeat edit (null: HEARTBEAT.md in the workspace is read).

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "heartbeats",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("every_minutes", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("chat_id", sa.String(128), nullable=False),
        sa.Column("quiet_start", sa.String(5), nullable=True),
        sa.Column("quiet_end", sa.String(5), nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("checklist", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_heartbeats"),
        sa.UniqueConstraint("user_key", name="uq_heartbeats_user_key"),
    )


def downgrade() -> None:
    op.drop_table("heartbeats")
