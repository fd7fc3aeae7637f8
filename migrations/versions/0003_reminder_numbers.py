"""Reminder numbers: each user's reminders are numbered 1, 2, 3... of their own.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07

Until now users saw the table's primary key, which told them how many reminders others had.
Existing rows are numbered per user in id order (the order they were made), cancelled and done
ones included, so no number is ever given twice while its row exists.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

# A correlated count rather than ROW_NUMBER() ... UPDATE FROM, which SQLite only has from 3.33.
BACKFILL = """
UPDATE reminders SET number = (
    SELECT count(*) FROM reminders AS earlier
    WHERE earlier.user_key = reminders.user_key AND earlier.id <= reminders.id
)
"""


def upgrade() -> None:
    op.add_column("reminders", sa.Column("number", sa.Integer(), nullable=True))
    op.execute(BACKFILL)
    # SQLite cannot add NOT NULL or a constraint to a table: batch mode copies it into a new one.
    with op.batch_alter_table("reminders") as batch:
        batch.alter_column("number", existing_type=sa.Integer(), nullable=False)
        batch.create_unique_constraint("uq_reminders_user_key_number", ["user_key", "number"])


def downgrade() -> None:
    with op.batch_alter_table("reminders") as batch:
        batch.drop_constraint("uq_reminders_user_key_number", type_="unique")
        batch.drop_column("number")
