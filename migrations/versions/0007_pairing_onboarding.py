"""Pairing that talks back: a stranger's first message is kept with their code, and answered once
the owner approves it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07

A stranger's message that asked for access was dropped: approved, they had to write again, and
were never told they could. `pairing_codes` now keeps where they asked (`chat_id`) and what they
wrote first (`message`, cut short); approving the code leaves both for the daemon to take up
(a welcome, then the message as their first turn), denying it deletes them.

`users.admin`: an owner made by `openclaw pairing approve CODE --admin` (the role it gives,
`--role`, goes to the existing `users.role`); the config's lists still decide for those they name.

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
    op.add_column("pairing_codes", sa.Column("chat_id", sa.String(128), nullable=True))
    op.add_column("pairing_codes", sa.Column("message", sa.Text(), nullable=True))
    op.add_column("users", sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy would drop and recreate
    # `users`, and with foreign keys on that deletes every user's pairing codes and conversations.
    op.drop_column("users", "admin")
    op.drop_column("pairing_codes", "message")
    op.drop_column("pairing_codes", "chat_id")
