"""The store's SQLite driver (openclaw/store/sqlite_driver.py) under SQLAlchemy, on real files.

What it promises: one trip to aiosqlite's thread per statement (plus one per commit; none where
the store has the last statement commit, base.commits_next, nor for a transaction that only
read), and otherwise the behaviour of a DB-API cursor that SQLAlchemy relies on: rows,
rowcount, lastrowid, executemany, streamed results, errors translated, and a failed transaction
rolled back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from openclaw.store import Store
from openclaw.store.engine import create_engine
from openclaw.store.sqlite_driver import OneTripConnection

META = MetaData()
ITEMS = Table("items", META, Column("id", Integer, primary_key=True),
              Column("name", String(20), unique=True, nullable=False))


@pytest.fixture
async def engine(tmp_path: Path):
    made = create_engine(f"sqlite:///{tmp_path / 'driver.db'}")
    async with made.begin() as conn:
        await conn.run_sync(META.create_all)
    yield made
    await made.dispose()


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions run on the driver's thread, by name, in order."""
    seen: list[str] = []
    original = OneTripConnection._execute

    async def counting(self, fn, *args, **kwargs):
        seen.append(getattr(fn, "__name__", repr(fn)))
        return await original(self, fn, *args, **kwargs)

    monkeypatch.setattr(OneTripConnection, "_execute", counting)
    return seen


async def test_an_insert_transaction_costs_one_trip_for_the_statement_and_one_for_the_commit(
        engine, trips: list[str]):
    async with engine.connect():
        pass  # the pool's connection is opened (and its pragmas run) before counting
    trips.clear()
    async with engine.begin() as conn:
        result = await conn.execute(insert(ITEMS), {"name": "a"})
    assert result.inserted_primary_key[0] == 1
    assert trips == ["_run_on_thread", "commit"]


async def test_a_store_message_insert_costs_one_trip_its_commit_in_it(tmp_path: Path,
                                                                      trips: list[str]):
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        await store.ensure_user("telegram", "1001")
        conv = await store.active_conversation("telegram:1001", "1001")
        trips.clear()
        first = await store.add_message(conv.id, "user", "hello", token_count=2)
        second = await store.add_message(conv.id, "assistant", "hi", token_count=1)
        assert trips == ["_run_on_thread"] * 2
        assert second.id == first.id + 1
        trips.clear()
        assert [m.content for m in await store.list_messages(conv.id)] == ["hello", "hi"]
        assert trips == ["_run_on_thread"]  # a read: no transaction was opened, none to commit
    # Committed: another connection (a new start) reads them.
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}") as again:
        assert [m.content for m in await again.list_messages(conv.id)] == ["hello", "hi"]


async def test_a_last_statement_that_fails_commits_nothing_and_the_next_transaction_is_clean(
        tmp_path: Path):
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        event, new = await store.record_inbound("telegram", 7, "telegram:1", "1", "hi")
        again, new_again = await store.record_inbound("telegram", 7, "telegram:1", "1", "hi")
        assert (new, new_again, again.id) == (True, False, event.id)  # the unique index refused
        with pytest.raises(LookupError):  # the foreign key refuses the last statement
            await store.add_message(999, "user", "nobody's")
        await store.ensure_user("telegram", "1")
        conv = await store.active_conversation("telegram:1", "1")
        await store.add_message(conv.id, "user", "kept")
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}") as again_opened:
        assert [m.content for m in await again_opened.list_messages(conv.id)] == ["kept"]
        assert len(await again_opened.pending_inbound()) == 1


async def test_rows_rowcount_and_lastrowid_come_back_as_a_cursor_would_give_them(engine):
    async with engine.begin() as conn:
        await conn.execute(insert(ITEMS), [{"name": f"n{i}"} for i in range(5)])  # executemany
        last = await conn.execute(insert(ITEMS), {"name": "last"})
        assert last.inserted_primary_key[0] == 6
        changed = await conn.execute(update(ITEMS).where(ITEMS.c.id <= 3).values(name=ITEMS.c.name + "!"))
        assert changed.rowcount == 3
        rows = (await conn.execute(select(ITEMS.c.id, ITEMS.c.name).order_by(ITEMS.c.id))).all()
    assert rows == [(1, "n0!"), (2, "n1!"), (3, "n2!"), (4, "n3"), (5, "n4"), (6, "last")]


async def test_a_streamed_result_hands_out_every_row_in_order_in_partitions(engine):
    async with engine.begin() as conn:
        await conn.execute(insert(ITEMS), [{"name": f"r{i:03}"} for i in range(250)])
    async with engine.connect() as conn:
        result = await conn.stream(select(ITEMS.c.name).order_by(ITEMS.c.id))
        sizes, names = [], []
        async for part in result.partitions(100):
            sizes.append(len(part))
            names += [row.name for row in part]
    assert sizes == [100, 100, 50]
    assert names == [f"r{i:03}" for i in range(250)]


async def test_a_constraint_error_is_sqlalchemys_and_the_failed_transaction_leaves_nothing(engine):
    with pytest.raises(IntegrityError):
        async with engine.begin() as conn:
            await conn.execute(insert(ITEMS), {"name": "kept?"})
            await conn.execute(insert(ITEMS), {"name": "kept?"})  # unique name: fails
    async with engine.connect() as conn:
        assert (await conn.execute(select(ITEMS.c.name))).all() == []
        # The connection is usable after the error.
        assert (await conn.execute(text("SELECT 40 + 2"))).scalar() == 42


async def test_the_sqlite_pragmas_still_apply_through_the_driver(engine):
    async with engine.connect() as conn:
        assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
        assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
