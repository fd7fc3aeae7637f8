"""Pairing by rate: the codes given out (what the per-stranger and overall rates count) and the
refused requests the owner is shown (`openclaw pairing list`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07

Three strangers could hold the three pending codes and ask again each time theirs expired, so
that nobody else ever got one. Codes are now counted per stranger (a day) and overall (an hour);
the counts cannot come from pairing_codes, whose expired rows retention deletes at once.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "pairing_issued",
        sa.Column("id", ID, primary_key=True),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pairing_issued"),
    )
    op.create_index("ix_pairing_issued_user_key_at", "pairing_issued", ["user_key", "at"])
    op.create_index("ix_pairing_issued_at", "pairing_issued", ["at"])
    op.create_table(
        "pairing_refusals",
        sa.Column("id", ID, primary_key=True),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_at", TS, nullable=False),
        sa.Column("last_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pairing_refusals"),
        sa.UniqueConstraint("user_key", name="uq_pairing_refusals_user_key"),
        sa.CheckConstraint("reason IN ('user_rate', 'overall_rate')",
                           name=op.f("ck_pairing_refusals_reason")),
    )
    op.create_index("ix_pairing_refusals_last_at", "pairing_refusals", ["last_at"])


def downgrade() -> None:
    op.drop_table("pairing_refusals")
    op.drop_table("pairing_issued")
