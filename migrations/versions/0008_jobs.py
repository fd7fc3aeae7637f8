"""Scheduled jobs: what a user (or the config's [[jobs]]) asked to run when, and each run.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07

`jobs` is the truth of what was asked (kind, schedule, zone, text); the scheduler's own table
(APScheduler's, created by its job store) holds only the triggers. `job_runs` records each firing
before it starts, unique on (job_id, due_at): a due time never runs twice, also across a crash.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", ID, primary_key=True),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("chat_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("schedule", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("config_name", sa.String(128), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.CheckConstraint("status IN ('active', 'paused', 'done', 'cancelled')",
                           name=op.f("ck_jobs_status")),
        sa.CheckConstraint("kind IN ('reminder', 'agent', 'heartbeat')", name=op.f("ck_jobs_kind")),
        sa.UniqueConstraint("user_key", "number", name="uq_jobs_user_key_number"),
        sa.UniqueConstraint("config_name", name="uq_jobs_config_name"),
    )
    op.create_index("ix_jobs_user_key_status", "jobs", ["user_key", "status"])
    op.create_table(
        "job_runs",
        sa.Column("id", ID, primary_key=True),
        sa.Column("job_id", ID, sa.ForeignKey("jobs.id", ondelete="CASCADE",
                                              name="fk_job_runs_job_id_jobs"), nullable=False),
        sa.Column("due_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_runs"),
        sa.UniqueConstraint("job_id", "due_at", name="uq_job_runs_job_id_due_at"),
    )


def downgrade() -> None:
    op.drop_table("job_runs")
    op.drop_table("jobs")
