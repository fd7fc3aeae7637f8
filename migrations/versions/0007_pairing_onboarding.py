"""Pairing that talks back: a stranger's first message is kept with their code, and answered once
the owner approves it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07

A stranger's message that asked for access was dropped: approved, they had to write again, and
were never told they could. `pairing_codes` now keeps where they asked (`chat_id`) and what they
wrote first (`message`, cut short); approving the code leaves both for the daemon to take up
(a welcome, then the message as their first turn), denying it deletes them.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("pairing_codes") as batch:
        batch.add_column(sa.Column("chat_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("message", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pairing_codes") as batch:
        batch.drop_column("message")
        batch.drop_column("chat_id")
