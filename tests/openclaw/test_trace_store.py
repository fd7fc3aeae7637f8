"""The store's traces of agent turns and the users' /private switch, on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from openclaw.store import Store, UserStatus
from openclaw.store.trace_records import TraceStatus
from tests.helpers.store import fresh_store

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with fresh_store(request, tmp_path) as opened:
        yield opened


async def _turn(store: Store, user: str, message_id: int, text: str = "hi"):
    """A user's message answered in their chat: (conversation id, event, user msg, reply)."""
    channel, external = user.split(":")
    await store.ensure_user(channel, external, status=UserStatus.ALLOWED)
    conv = await store.active_conversation(user, external, channel)
    event, _ = await store.record_inbound(channel, message_id, user, external, text)
    asked = await store.add_message(conv.id, "user", text)
    answer = await store.add_message(conv.id, "assistant", f"re: {text}")
    return conv.id, event, asked, answer


async def test_a_trace_is_stored_once_per_message_with_its_messages(store: Store):
    conv, event, asked, answer = await _turn(store, "telegram:1", 10)
    first = await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                                  started_at=T0, inbound_event_id=event.id,
                                  first_message_id=asked.id, last_message_id=answer.id,
                                  prompt_version="system=v3;tools=builtin", model="m",
                                  sampling={"temperature": 0.7}, steps=1, reply_chars=6)
    assert first is not None
    again = await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                                  started_at=T0, inbound_event_id=event.id)
    assert again is None  # a turn taken up again after a restart is not traced twice
    [trace] = await store.list_traces()
    assert (trace.id, trace.status, trace.prompt_version, trace.sampling) == (
        first, TraceStatus.ANSWERED, "system=v3;tools=builtin", {"temperature": 0.7})
    messages = await store.trace_messages([trace])
    assert [m.id for m in messages[trace.id]] == [asked.id, answer.id]


async def test_a_resumed_turn_finds_its_user_message(store: Store):
    conv, event, asked, answer = await _turn(store, "telegram:1", 10)
    await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                          started_at=T0, inbound_event_id=event.id, last_message_id=answer.id)
    [trace] = await store.list_traces()
    assert trace.first_message_id == asked.id


async def test_a_private_user_is_not_traced_and_their_old_traces_are_not_listed(store: Store):
    conv, event, asked, answer = await _turn(store, "telegram:1", 10)
    other_conv, other_event, *_ = await _turn(store, "telegram:2", 11)
    await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                          started_at=T0, inbound_event_id=event.id)
    await store.add_trace(user="telegram:2", conversation_id=other_conv, status="answered",
                          started_at=T0, inbound_event_id=other_event.id)
    assert await store.set_private("telegram:1", True)
    assert await store.is_private("telegram:1") and not await store.is_private("telegram:2")
    assert (await store.get_user("telegram", 1)).private
    assert [t.user for t in await store.list_traces()] == ["telegram:2"]
    assert len(await store.list_traces(include_private=True)) == 2
    _, later, *_ = await _turn(store, "telegram:1", 12)
    assert await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                                 started_at=T0, inbound_event_id=later.id) is None
    assert await store.set_private("telegram:1", False)
    assert {t.user for t in await store.list_traces()} == {"telegram:1", "telegram:2"}
    assert not await store.set_private("telegram:99", True)  # no such user: nothing to change


async def test_traces_are_listed_by_start_time(store: Store):
    conv, *_ = await _turn(store, "telegram:1", 10)
    for day in range(3):
        await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                              started_at=T0 + timedelta(days=day))
    listed = await store.list_traces(T0 + timedelta(days=1), T0 + timedelta(days=2))
    assert [t.started_at for t in listed] == [T0 + timedelta(days=1)]


async def test_forgetting_a_user_deletes_their_traces(store: Store):
    conv, event, *_ = await _turn(store, "telegram:1", 10)
    await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                          started_at=T0, inbound_event_id=event.id)
    counts = await store.forget_user("telegram:1")
    assert counts["traces"] == 1
    assert await store.list_traces(include_private=True) == []


async def test_a_trace_outlives_its_journal_row_and_goes_with_its_conversation(store: Store):
    from openclaw.store import InboundStatus
    from openclaw.store.retention import Retention, prune

    conv, event, asked, answer = await _turn(store, "telegram:1", 10)
    await store.add_trace(user="telegram:1", conversation_id=conv, status="answered",
                          started_at=T0, inbound_event_id=event.id, first_message_id=asked.id,
                          last_message_id=answer.id)
    await store.mark_inbound(event.id, InboundStatus.PROCESSED)
    async with store.engine.begin() as db:
        await db.exec_driver_sql("UPDATE inbound_events SET processed_at = '2020-01-01 00:00:00'")
    assert (await prune(store, Retention()))["inbound messages"] == 1
    [trace] = await store.list_traces()
    assert trace.inbound_event_id is None  # the journal row went; the trace and its messages stay
    assert len((await store.trace_messages([trace]))[trace.id]) == 2

    await store.archive_conversation(conv)  # /new, long ago; a newer conversation follows it
    await store.active_conversation("telegram:1", "1", "telegram")
    async with store.engine.begin() as db:
        await db.exec_driver_sql("UPDATE conversations SET archived_at = '2020-01-01 00:00:00' "
                                 "WHERE archived_at IS NOT NULL")
    assert (await prune(store, Retention(keep_archived_days=30)))["archived conversations"] == 1
    assert await store.list_traces(include_private=True) == []
