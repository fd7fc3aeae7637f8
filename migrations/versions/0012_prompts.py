"""The prompt library: versioned prompts, the active version or A/B split of each, users' pins, and
on each assistant message the versions that produced it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07

`prompt_versions` holds each stored version of a named prompt ("system", "tools"): its text,
author, when and after which earlier version; immutable once stored. `prompt_settings` holds, per
name, the active version and, while an A/B test runs, the variants' weights. `prompt_pins` gives
a user one version of a name whatever the rest say. `messages.prompt_version` is the label
("system=v3;tools=builtin") of the versions an assistant message was answered with.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "prompt_versions",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("author", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("parent_id", ID, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_prompt_versions"),
        sa.ForeignKeyConstraint(["parent_id"], ["prompt_versions.id"],
                                name="fk_prompt_versions_parent_id_prompt_versions"),
        sa.UniqueConstraint("name", "version", name="uq_prompt_versions_name_version"),
    )
    op.create_table(
        "prompt_settings",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("active", sa.String(32), nullable=True),
        sa.Column("variants", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_prompt_settings"),
    )
    op.create_table(
        "prompt_pins",
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("user_key", "name", name="pk_prompt_pins"),
    )
    op.add_column("messages", sa.Column("prompt_version", sa.String(160), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), as 0007: a batch copy of `messages`
    # would recreate the table under every conversation's history.
    op.drop_column("messages", "prompt_version")
    op.drop_table("prompt_pins")
    op.drop_table("prompt_settings")
    op.drop_table("prompt_versions")
