"""The store's long-term memory, on SQLite (FTS5) and PostgreSQL (tsvector): entries found by
their words, pinned ones always, each user's and each scope's apart, bounded, never rewritten."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from openclaw.store import Store
from openclaw.store.memory_records import EVERYWHERE, PRIVATE, MemoryFull, MemoryKind, chat_scope
from tests.helpers.clock import FakeClock
from tests.helpers.store import fresh_store

ADA, BOB = "telegram:1001", "telegram:1002"
GROUP = chat_scope("-500", is_group=True)
MINE = (PRIVATE, EVERYWHERE)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request, tmp_path, clock):
    async with fresh_store(request, tmp_path, clock=clock) as opened:
        yield opened


async def add(store: Store, user: str, words: str, scope: str = PRIVATE, **kw):
    entry, _ = await store.add_memory(user, scope, words, **kw)
    return entry


async def indexed(store: Store, word: str) -> int:
    """Rows the full-text index itself still finds for `word` (anyone's)."""
    async with store.engine.connect() as conn:
        if store.dialect == "sqlite":
            sql = "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH :w"
        else:
            sql = ("SELECT count(*) FROM memories WHERE to_tsvector('simple'::regconfig, text) "
                   "@@ to_tsquery('simple'::regconfig, :w)")
        return (await conn.execute(text(sql), {"w": word})).scalar()


async def test_recall_finds_entries_by_their_words_ranked_and_pinned_ones_always(store, clock):
    await add(store, ADA, "My name is Ada", kind=MemoryKind.FACT, pinned=True)
    await add(store, ADA, "Answer in French", kind=MemoryKind.INSTRUCTION, pinned=True)
    await add(store, ADA, "Ada's cat is called Whiskers")
    await add(store, ADA, "Ada likes green tea and tea cakes", kind=MemoryKind.PREFERENCE)
    await add(store, ADA, "The dentist is on Tuesday")

    found = await store.search_memories(ADA, MINE, "What tea should I brew? Tea!")
    assert [e.text for e in found] == ["Ada likes green tea and tea cakes"]
    found = await store.search_memories(ADA, MINE, "cat's name, whiskers?")
    assert found[0].text == "Ada's cat is called Whiskers"
    assert await store.search_memories(ADA, MINE, "a ? !! __") == []  # no words: nothing

    recalled = await store.recall(ADA, MINE, "when is the dentist", limit=2)
    assert [e.text for e in recalled] == ["My name is Ada", "Answer in French",
                                          "The dentist is on Tuesday"]


async def test_a_user_never_finds_another_users_entries_nor_a_group_its_private_ones(store):
    await add(store, ADA, "ada secret diagnosis")
    await add(store, ADA, "ada group plan diagnosis", scope=GROUP)
    await add(store, BOB, "bob diagnosis", pinned=True)
    await add(store, ADA, "ada diagnosis for every chat", scope=EVERYWHERE)

    in_private = await store.recall(ADA, MINE, "diagnosis")
    assert {e.text for e in in_private} == {"ada secret diagnosis", "ada diagnosis for every chat"}
    in_group = await store.recall(ADA, (GROUP, EVERYWHERE), "diagnosis")
    assert {e.text for e in in_group} == {"ada group plan diagnosis", "ada diagnosis for every chat"}
    assert [e.text for e in await store.recall(BOB, (GROUP, EVERYWHERE), "diagnosis")] == []
    assert [e.user for e in await store.list_memories(BOB)] == [BOB]
    # Bob's numbers are his own: his #1 is not Ada's #1, and he cannot forget hers.
    assert await store.forget_memory(BOB, 2, MINE) is None
    assert len(await store.list_memories(ADA)) == 3


async def test_duplicates_merge_and_the_oldest_unpinned_go_past_the_bound(store, clock):
    first, new = await store.add_memory(ADA, PRIVATE, "likes tea")
    assert new
    again, new = await store.add_memory(ADA, PRIVATE, "  Likes   TEA ", pinned=True)
    assert not new and again.id == first.id
    assert [e.pinned for e in await store.list_memories(ADA)] == [True]  # the merge pinned it
    for n in range(4):
        clock.advance(1)
        await add(store, ADA, f"note {n}", max_entries=3)
    assert [e.text for e in await store.list_memories(ADA)] == ["likes tea", "note 2", "note 3"]
    assert await indexed(store, "note") == 2  # the dropped ones left the index too

    with pytest.raises(ValueError, match="at most 10"):
        await add(store, ADA, "x" * 11, max_chars=10)
    await add(store, ADA, "pinned two", pinned=True, max_entries=3)
    await add(store, ADA, "pinned three", pinned=True, max_entries=3)
    with pytest.raises(MemoryFull):
        await add(store, ADA, "one more", max_entries=3)
    assert [e.text for e in await store.list_memories(ADA)] == ["likes tea", "pinned two",
                                                               "pinned three"]


async def test_forget_deletes_the_entry_from_the_index(store):
    kept = await add(store, ADA, "keep the umbrella")
    gone = await add(store, ADA, "forget the zeppelin")
    group = await add(store, ADA, "group zeppelin", scope=GROUP)
    assert await store.forget_memory(ADA, group.number, MINE) is None  # not this chat's
    assert (await store.forget_memory(ADA, gone.number, MINE)).text == "forget the zeppelin"
    assert await store.forget_memory(ADA, gone.number, MINE) is None
    assert await indexed(store, "zeppelin") == 1  # the group's
    assert await store.search_memories(ADA, MINE, "zeppelin") == []
    assert [e.id for e in await store.list_memories(ADA, MINE)] == [kept.id]


async def test_users_forget_deletes_memory_and_its_index(store):
    await add(store, ADA, "ada's quokka")
    await add(store, BOB, "bob's quokka")
    await store.set_memory_enabled(ADA, False)
    counts = await store.forget_user(ADA)
    assert counts["memory entries"] == 1 and counts["memory settings"] == 1
    assert await indexed(store, "quokka") == 1
    assert [e.user for e in await store.search_memories(BOB, MINE, "quokka")] == [BOB]
    assert await store.memory_enabled(ADA)


async def test_replace_keeps_pinned_entries_and_numbers_new_ones(store):
    pinned = await add(store, ADA, "my name is Ada", pinned=True)
    old = [await add(store, ADA, f"detail {n}") for n in range(3)]
    made = await store.replace_memories(
        ADA, [pinned.id, *(e.id for e in old)],
        [(PRIVATE, "details 0 to 2", MemoryKind.SUMMARY, "consolidated:1,2,3")])
    assert [e.text for e in await store.list_memories(ADA)] == ["my name is Ada", "details 0 to 2"]
    assert made[0].number == 5  # never a number given before
    assert await indexed(store, "detail") == 0


async def test_memory_off_and_on(store):
    assert await store.memory_enabled(ADA)
    await store.set_memory_enabled(ADA, False)
    await store.set_memory_enabled(ADA, False)
    assert not await store.memory_enabled(ADA) and await store.memory_enabled(BOB)
    await store.set_memory_enabled(ADA, True)
    assert await store.memory_enabled(ADA)


async def test_memory_survives_a_restart(tmp_path: Path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}"
    async with await Store.open(url) as store:
        await add(store, ADA, "the boat is blue")
    async with await Store.open(url) as store:
        assert [e.text for e in await store.search_memories(ADA, MINE, "boat")] == ["the boat is blue"]
