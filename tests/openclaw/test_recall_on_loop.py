"""A turn's memory recall runs its reads on the loop's own SQLite connection (store/memory.py,
LoopWriter.read), within a time budget past which they run on the thread as before: the same
entries either way. Real SQLite with its FTS5 index."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from openclaw.store import Store, loop_writer
from openclaw.store.loop_writer import NOT_DONE
from openclaw.store.memory import SEARCH_HITS
from openclaw.store.memory_records import EVERYWHERE, PRIVATE, chat_scope

ADA, BOB = "telegram:1001", "telegram:1002"
GROUP = chat_scope("-500", is_group=True)
QUERIES = ["where does ada live", "what about the river town", "recipe for the oven",
           "nothing matches this", "", "a common word and the river", "the the the"]


@pytest.fixture
async def store(tmp_path):
    opened = await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True)
    try:
        facts = ["Ada lives in a river town", "the oven recipe takes an hour",
                 "Ada prefers short answers", "the river floods in spring",
                 "call the plumber about the oven", "Ada's town has a market on Sundays"]
        for i, fact in enumerate(facts):
            await opened.add_memory(ADA, PRIVATE if i % 3 else EVERYWHERE, fact, pinned=i == 2)
        await opened.add_memory(ADA, GROUP, "the group meets by the river")
        await opened.add_memory(BOB, PRIVATE, "Bob lives by the river too")
        # A word in more entries than a search ranks: the rarer words are taken instead.
        for i in range(SEARCH_HITS + 5):
            await opened.add_memory(BOB, PRIVATE, f"common note {i}")
        yield opened
    finally:
        await opened.close()


async def _on_thread(store: Store, *args, **kwargs):
    writer, store.loop_writer = store.loop_writer, None
    try:
        return await store.recall(*args, **kwargs)
    finally:
        store.loop_writer = writer


async def test_the_loop_recalls_what_the_thread_recalls(store):
    writer = store.loop_writer
    answered = []
    read = writer.read
    writer.read = lambda body, budget_s=None: answered.append(read(body, budget_s)) or answered[-1]
    for query in QUERIES:
        for scopes in ((PRIVATE, EVERYWHERE), (GROUP, EVERYWHERE)):
            for user in (ADA, BOB):
                for limit, pinned in ((8, True), (1, True), (0, True), (8, False)):
                    on_loop = await store.recall(user, scopes, query, limit=limit, pinned=pinned)
                    assert on_loop == await _on_thread(store, user, scopes, query, limit=limit,
                                                       pinned=pinned), (query, scopes, user)
    assert answered and NOT_DONE not in answered  # every one answered on the loop
    found = await store.recall(ADA, (PRIVATE, EVERYWHERE), "where does ada live")
    assert found[0].text == "Ada prefers short answers" and found[0].pinned  # pinned first
    assert {e.text for e in found[1:]} >= {"Ada lives in a river town",
                                          "Ada's town has a market on Sundays"}
    assert all(e.user == ADA and e.created_at.tzinfo is not None for e in found)


async def test_reads_past_the_budget_run_on_the_thread_with_the_same_answer(store, monkeypatch):
    expected = await store.recall(ADA, (PRIVATE, EVERYWHERE), "the river town")
    monkeypatch.setattr(loop_writer, "READ_BUDGET_S", 0.0)
    writer = store.loop_writer
    # Interrupted at its first look at the clock: nothing is answered on the loop, and the
    # connection goes on.
    long = writer.prepare("long", lambda: text(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000) "
        "SELECT count(*) FROM c"))
    assert writer.read(lambda read: read(long, {})) is NOT_DONE
    assert await store.recall(ADA, (PRIVATE, EVERYWHERE), "the river town") == expected
    monkeypatch.undo()
    assert writer.read(lambda read: read(long, {})) == [(1000,)]
    assert await store.recall(ADA, (PRIVATE, EVERYWHERE), "the river town") == expected
    await store.add_memory(ADA, PRIVATE, "a new fact about the river")  # writes go on
    found = await store.recall(ADA, (PRIVATE, EVERYWHERE), "the river town")
    assert "a new fact about the river" in [e.text for e in found]
    assert found == await _on_thread(store, ADA, (PRIVATE, EVERYWHERE), "the river town")


async def test_a_recall_waits_for_no_checkpoint_even_while_the_wal_grows_past_its_bound(store):
    writer = store.loop_writer
    await store.ensure_user("telegram", 1001)
    conversation = await store.active_conversation(ADA, "1001")
    while writer.checkpoint is None:  # a commit grew the -wal file past its threshold
        await store.add_message(conversation.id, "user", "x" * 50_000)
    writer.too_long = True  # as when the file grows past WAIT_BYTES: writes wait for it
    running = writer.checkpoint
    recalling = asyncio.ensure_future(store.recall(ADA, (PRIVATE, EVERYWHERE), "the river town"))
    await asyncio.sleep(0)  # one step: a call that waited for the checkpoint is not done
    assert recalling.done() and not running.done()
    assert "Ada lives in a river town" in [e.text for e in recalling.result()]
    await asyncio.wait({running})
