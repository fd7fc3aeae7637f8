"""Retention: indexes on the times the store's clean-up selects old rows by.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

The daemon's daily clean-up and `openclaw db prune` (openclaw/store/retention.py) delete handled
inbound messages by status and `processed_at`, delivered or given-up replies by status and
`updated_at`, and audit rows by `at`, a few hundred at a time: without an index each batch would
read the whole table (with (status, id) alone SQLite reads every handled row). Usage rows
already have one on `at`; `conversation_id` gets one so that deleting a conversation (archived
ones past `keep_archived_days`, `openclaw users forget`) need not read all of usage to unlink it.
Users and conversations are few (people, chats) and are read whole.

Written by hand and frozen, like 0001.
"""

from __future__ import annotations

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

INDEXES = {
    "ix_inbound_events_status_processed_at": ("inbound_events", ["status", "processed_at"]),
    "ix_outbound_messages_status_updated_at": ("outbound_messages", ["status", "updated_at"]),
    "ix_audit_log_at": ("audit_log", ["at"]),
    "ix_usage_conversation_id": ("usage", ["conversation_id"]),
}


def upgrade() -> None:
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, (table, _) in INDEXES.items():
        op.drop_index(name, table_name=table)
