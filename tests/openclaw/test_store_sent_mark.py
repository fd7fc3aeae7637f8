"""Store.mark_sent, the outbox's mark after each piece it sends: the row as mark_outbound(sent)
leaves it, in one statement, and the same errors. On both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from openclaw.store import Store
from openclaw.store.records import OutboundStatus
from tests.helpers.store import fresh_store


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with fresh_store(request, tmp_path) as opened:
        yield opened


async def test_a_piece_marked_sent_is_final_and_counted_as_an_attempt(store: Store):
    [out] = await store.add_reply("telegram", 1, ["hello"])
    await store.mark_outbound(out.id, "pending", error="timed out")
    await store.mark_sent(out.id, 777)
    [sent] = await store.list_outbound()
    assert (sent.status, sent.attempts, sent.external_message_id, sent.error) == (
        OutboundStatus.SENT, 2, "777", None)
    assert sent.sent_at is not None and await store.pending_outbound() == []
    with pytest.raises(ValueError, match="already sent"):
        await store.mark_sent(out.id, 778)
    with pytest.raises(LookupError):
        await store.mark_sent(10_000, 1)
