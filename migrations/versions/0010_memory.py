"""Long-term memory per user: short entries (facts, preferences, standing instructions,
summaries), each in a scope (the user's private chats, one group chat, or everywhere), with a
full-text index; and who turned their memory off.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07

The index: on SQLite an FTS5 table over `memories.text` (external content, so the text is kept
once), kept in step by triggers, so every way a row goes (a /memory forget, `users forget`, a
consolidation, a bound) leaves the index too without each remembering to; on PostgreSQL a GIN
index over to_tsvector('simple', text), which the database keeps itself. 'simple' and FTS5's
unicode61 both split words without a language's stemming, so both backends find the same words.

Written by hand and frozen, like 0001: types are spelled out, not imported from the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)

SQLITE_INDEX = (
    "CREATE VIRTUAL TABLE memories_fts USING fts5(text, content='memories', content_rowid='id', "
    "tokenize='unicode61 remove_diacritics 2')",
    "CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN "
    "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN "
    "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER memories_fts_update AFTER UPDATE OF text ON memories BEGIN "
    "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO memories_fts(rowid, text) VALUES (new.id, new.text); END",
)
POSTGRESQL_INDEX = ("CREATE INDEX memories_fts_gin ON memories "
                    "USING gin (to_tsvector('simple'::regconfig, text))",)


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column("id", ID, primary_key=True),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("scope", sa.String(160), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("source", sa.String(2000), nullable=True),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_memories"),
        sa.UniqueConstraint("user_key", "number", name="uq_memories_user_key_number"),
        sa.CheckConstraint("kind IN ('fact', 'preference', 'instruction', 'summary')",
                           name=op.f("ck_memories_kind")),
    )
    op.create_index("ix_memories_user_key_scope_digest", "memories",
                    ["user_key", "scope", "digest"])
    op.create_index("ix_memories_user_key_pinned_created_at", "memories",
                    ["user_key", "pinned", "created_at"])
    op.create_table(
        "memory_off",
        sa.Column("id", ID, primary_key=True),
        sa.Column("user_key", sa.String(160), nullable=False),
        sa.Column("since", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_memory_off"),
        sa.UniqueConstraint("user_key", name="uq_memory_off_user_key"),
    )
    dialect = op.get_bind().dialect.name
    for statement in SQLITE_INDEX if dialect == "sqlite" else POSTGRESQL_INDEX:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("memories_fts_insert", "memories_fts_delete", "memories_fts_update"):
            op.execute(f"DROP TRIGGER {name}")
        op.execute("DROP TABLE memories_fts")
    op.drop_table("memory_off")
    op.drop_table("memories")
