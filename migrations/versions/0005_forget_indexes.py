"""Indexes that find one user's inbound messages and one chat's replies without reading the journal.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

`openclaw users forget` (Store.forget_user) deletes a user's inbound messages by `user_key`, and
the replies sent to their private chat by channel and chat id. Neither had an index: each read the
whole table, which holds every message of the last `keep_journal_days` (30) and all of them with
0, measured at 1.5 s for 500k inbound and 500k outbound rows (bench/store_scale.py). The replies'
index also ends in status and id, so that one chat's pending replies (the outbox's retry,
`Store.pending_outbound(channel, chat_id)`, a moved chat) are read exactly, in the order they are
sent, rather than through every chat's pending ones: an index on (channel, chat_id) alone would
have let SQLite read the whole chat's history there instead.

Written by hand and frozen, like 0001.
"""

from __future__ import annotations

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

INDEXES = {
    "ix_inbound_events_user_key": ("inbound_events", ["user_key"]),
    "ix_outbound_messages_channel_chat_id_status_id": ("outbound_messages",
                                                       ["channel", "chat_id", "status", "id"]),
}


def upgrade() -> None:
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, (table, _) in INDEXES.items():
        op.drop_index(name, table_name=table)
