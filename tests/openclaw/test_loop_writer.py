"""The store's per-turn writes on the event loop's thread (openclaw/store/loop_writer.py), on real
SQLite files: they finish without a trip to the driver's thread, store what the driver's path
stores, are committed as the call returns (another connection, a killed process), and a write
lock held elsewhere neither blocks the loop nor loses a write.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from openclaw.store import Store
from openclaw.store import base as store_base
from openclaw.store import engine as store_engine
from openclaw.store.loop_writer import CHECKPOINT_BYTES, STAT_EVERY, WAIT_BYTES

SPECIAL = "a\x00b \ud800 ü"  # made storable (U+FFFD) on both paths alike


def _finishes_at_once(coro: Any) -> Any:
    """The result of `coro` if it ends at its first step, without yielding to the loop (so
    without a trip to the driver's thread); fails otherwise."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("the call waited for something: it was not written on the loop")


async def _a_turns_writes(store: Store) -> list[Any]:
    user = await store.ensure_user("telegram", 1001)
    conv = await store.active_conversation(user.key, "1001")
    event, new = await store.record_inbound("telegram", 7, user.key, "1001", SPECIAL,
                                            payload={"k": [1, SPECIAL]})
    assert new
    message = await store.add_message(conv.id, "assistant", SPECIAL,
                                      tool_calls=[{"id": "c1", "args": {"x": SPECIAL}}],
                                      token_count=3, prompt_version="v1")
    result = await store.add_message(conv.id, "tool", "did it", tool_call_id="c1", audit=dict(
        user=user.key, skill="s" * 300, arguments={"cmd": SPECIAL}, decision="allowed",
        exit_status=0, duration_ms=5, output_bytes=6, detail=None))
    pieces = await store.add_reply("telegram", "1001", ["one", SPECIAL], conversation_id=conv.id,
                                   answers=event.id)
    await store.mark_sent(pieces[0].id, 555)
    await store.add_usage(user.key, 10, 20, conversation_id=conv.id)
    started = datetime(2026, 12, 7, 11, 0, tzinfo=UTC)
    trace = await store.add_trace(user=user.key, conversation_id=conv.id, status="answered",
                                  started_at=started, inbound_event_id=event.id,
                                  last_message_id=result.id, prompt_version="p" * 200,
                                  model=SPECIAL, sampling={"t": 0.5}, last_tool_failed=True,
                                  usage=(5, 6))
    again = await store.add_trace(user=user.key, conversation_id=conv.id, status="answered",
                                  started_at=started, inbound_event_id=event.id, usage=(7, 8))
    await store.set_private(user.key, True)
    private = await store.add_trace(user=user.key, conversation_id=conv.id, status="answered",
                                    started_at=started, usage=(9, 10))
    return [event, message, result, pieces, (trace, again, private)]


def _rows(db: Path) -> dict[str, list[tuple]]:
    reader = sqlite3.connect(db)
    try:
        return {table: reader.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
                for table in ("inbound_events", "messages", "audit_log", "outbound_messages",
                              "usage", "traces")}
    finally:
        reader.close()


class _Clock:
    def __call__(self) -> datetime:
        return datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC)


async def _on_each_path(tmp_path: Path, writes: Any, read: Any) -> dict[bool, tuple]:
    """By whether the loop's writer wrote: what `writes(store)` returned, what `read(store,
    records)` read back through the ORM (the driver's connection), and every row."""
    stored = {}
    for loop_writes in (True, False):
        db = tmp_path / f"{loop_writes}.db"
        async with await Store.open(f"sqlite:///{db}", clock=_Clock(),
                                    loop_writes=loop_writes) as store:
            assert (store.loop_writer is not None) is loop_writes
            records = await writes(store)
            read_back = await read(store, records)
        stored[loop_writes] = (records, read_back, _rows(db))
    return stored


async def test_a_turns_writes_on_the_loop_store_what_the_drivers_path_stores(tmp_path: Path):
    async def read(store: Store, records: list[Any]) -> tuple:
        return (await store.list_messages(records[1].conversation_id),
                await store.list_outbound(), await store.pending_inbound())

    stored = await _on_each_path(tmp_path, _a_turns_writes, read)
    assert stored[True] == stored[False]


async def test_each_per_turn_write_finishes_without_a_trip_to_the_drivers_thread(tmp_path: Path):
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True) as store:
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        event, new = _finishes_at_once(store.record_inbound("telegram", 1, user.key, "1", "hi"))
        message = _finishes_at_once(store.add_message(conv.id, "user", "hi"))
        pieces = _finishes_at_once(store.add_reply("telegram", "1", ["hello"],
                                                   conversation_id=conv.id, answers=event.id))
        _finishes_at_once(store.mark_sent(pieces[0].id, None))
        _finishes_at_once(store.add_usage(user.key, 1, 2, conversation_id=conv.id))
        assert _finishes_at_once(store.add_trace(
            user=user.key, conversation_id=conv.id, status="answered", started_at=_Clock()(),
            inbound_event_id=event.id, last_message_id=message.id, usage=(1, 2))) is not None
        assert new and message.id and [m.content for m in await store.list_messages(conv.id)] == ["hi"]
        assert [o.status for o in await store.list_outbound()] == ["sent"]


async def test_what_the_loop_cannot_write_takes_the_drivers_path_and_its_errors(tmp_path: Path):
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True) as store:
        first, new = await store.record_inbound("telegram", 7, "telegram:1", "1", "hi")
        again, new_again = await store.record_inbound("telegram", 7, "telegram:1", "1", "hi")
        assert (new, new_again, again.id) == (True, False, first.id)  # a redelivery, found
        with pytest.raises(LookupError):  # the foreign key refuses it on both paths
            await store.add_message(999, "user", "nobody's")
        pieces = await store.add_reply("telegram", "1", ["x"], answers=first.id)
        await store.mark_sent(pieces[0].id, None)
        with pytest.raises(ValueError, match="already sent"):
            await store.mark_sent(pieces[0].id, None)
        with pytest.raises(LookupError):
            await store.mark_sent(10_000, None)
        assert _rows(tmp_path / "s.db")["messages"] == []


async def test_a_write_lock_held_elsewhere_blocks_not_the_loop_and_loses_no_write(tmp_path: Path):
    """Another process (the CLI, a backup) holds the write lock: the call waits for it on the
    driver's thread, not on the loop, and its row is stored once the lock is let go."""
    db = tmp_path / "s.db"
    async with await Store.open(f"sqlite:///{db}", loop_writes=True) as store:
        # The loop's connection never waits for a lock, nor checkpoints (an fsync) on a commit.
        assert store.loop_writer is not None
        assert (store.loop_writer.pragma("busy_timeout"),
                store.loop_writer.pragma("wal_autocheckpoint")) == (0, 0)
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        other = sqlite3.connect(db, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # the write lock, held
            writing = asyncio.ensure_future(store.add_message(conv.id, "user", "waits"))
            ticks = 0
            while ticks < 20:  # the loop goes on while the call waits
                await asyncio.sleep(0)
                ticks += 1
            assert not writing.done()
            other.execute("COMMIT")
        finally:
            other.close()
        message = await writing
        assert [m.id for m in await store.list_messages(conv.id)] == [message.id]
        # The lock gone, the next write is on the loop again.
        _finishes_at_once(store.add_message(conv.id, "user", "at once"))


async def test_calls_on_the_loop_and_on_the_thread_write_at_once_without_a_deadlock(tmp_path):
    """Transactions of the driver's connection (several statements, awaited) and writes on the
    loop's connection, interleaved: every write is stored once."""
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True) as store:
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        calls = []
        for i in range(30):
            calls.append(store.add_message(conv.id, "user", f"m{i}"))
            calls.append(store.add_summary(conv.id, i, f"s{i}", 1))  # the thread's
            calls.append(store.record_inbound("telegram", i, user.key, "1001", f"e{i}"))
        await asyncio.wait_for(asyncio.gather(*calls), 60)
        assert len(await store.list_messages(conv.id)) == 30
        assert len(_rows(tmp_path / "s.db")["inbound_events"]) == 30


async def test_the_loops_writes_are_checkpointed_on_the_thread_so_the_wal_is_reused(tmp_path):
    db = tmp_path / "s.db"
    async with await Store.open(f"sqlite:///{db}", loop_writes=True) as store:
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        big = "x" * 50_000
        # Writes that never let the loop run a checkpoint (none of them awaits anything) until
        # the file reached WAIT_BYTES, where a call waits for one.
        for _ in range(3 * WAIT_BYTES // len(big)):
            await store.add_message(conv.id, "user", big)
        # Without a checkpoint the file would hold every write; checkpointed, it is reused.
        assert os.stat(f"{db}-wal").st_size < WAIT_BYTES + 2 * CHECKPOINT_BYTES
        assert store.loop_writer is not None and store.loop_writer.commits > 3 * 300


async def test_a_running_checkpoint_holds_up_no_write_before_a_reply_and_the_next_after_one(
        tmp_path):
    db, wal = tmp_path / "s.db", Path(f"{tmp_path / 's.db'}-wal")
    async with await Store.open(f"sqlite:///{db}", loop_writes=True) as store:
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        writer = store.loop_writer
        assert writer is not None
        big = "x" * 50_000
        while writer.checkpoint is None:  # a commit grew the file past CHECKPOINT_BYTES
            await store.add_message(conv.id, "user", big)
        running = writer.checkpoint
        # A turn's writes before its reply go on beside the checkpoint, on the loop, at once.
        event, _ = _finishes_at_once(store.record_inbound("telegram", 1, user.key, "1001", "hi"))
        _finishes_at_once(store.add_message(conv.id, "user", "hi"))
        pieces = _finishes_at_once(store.add_reply("telegram", "1001", ["hello"],
                                                   conversation_id=conv.id, answers=event.id))
        assert not running.done()
        size = wal.stat().st_size
        # The sent-mark, made once the reply is out, waits for it; the file then starts over, so
        # the writes after it reuse the file from its start rather than grow it.
        await store.mark_sent(pieces[0].id, 77)
        assert running.done()
        for _ in range(CHECKPOINT_BYTES // len(big) // 2):
            await store.add_message(conv.id, "user", big)
        assert wal.stat().st_size == size
        assert await store.pending_outbound() == []


async def _written_behind_a_reader(db: Path, store: Store, conversation_id: int,
                                   wal_bytes: int) -> None:
    """Big messages written while a reader holds its snapshot (so none of them can be
    checkpointed) until the -wal file holds `wal_bytes`."""
    wal = Path(f"{db}-wal")
    reader = sqlite3.connect(db, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM messages").fetchone()  # its snapshot is held now
        while wal.stat().st_size < wal_bytes:
            await store.add_message(conversation_id, "user", "x" * 60_000)
    finally:
        reader.close()


async def test_the_wal_is_cut_back_to_its_limit_once_a_long_reader_lets_go_on_the_loop_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # test_store.py's test of the driver's path, with the writes on the loop's connection: it,
    # too, may be the writer that starts the -wal file over, and must cut it back then.
    limit = 256 * 1024
    monkeypatch.setattr(store_engine, "JOURNAL_SIZE_LIMIT", limit)
    db = tmp_path / "s.db"
    wal = Path(f"{db}-wal")
    async with await Store.open(f"sqlite:///{db}", loop_writes=True) as store:
        user = await store.ensure_user("telegram", 42)
        conv = await store.active_conversation(user.key, "42")
        await _written_behind_a_reader(db, store, conv.id, 24 * limit + 1)
        writer = store.loop_writer
        assert writer is not None
        for _ in range(3 * STAT_EVERY):
            await store.add_message(conv.id, "user", "hello")
            if writer.checkpoint is not None:  # as a turn's wait for its model lets it run
                await asyncio.wait({writer.checkpoint})
        assert wal.stat().st_size <= limit


def _write_and_die(db: str, ready: Any) -> None:
    async def main() -> None:
        store = await Store.open(f"sqlite:///{db}", loop_writes=True)
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        _finishes_at_once(store.add_message(conv.id, "user", "kept"))
        ready.set()
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())


async def test_a_write_on_the_loop_survives_the_process_killed_right_after(tmp_path: Path):
    db = tmp_path / "s.db"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_write_and_die, args=(str(db), ready))
    child.start()
    await asyncio.to_thread(child.join, 120)
    assert child.exitcode == -signal.SIGKILL and ready.is_set()
    async with await Store.open(f"sqlite:///{db}", loop_writes=True) as store:
        conv = await store.active_conversation("telegram:1001", "1001")
        assert [m.content for m in await store.list_messages(conv.id)] == ["kept"]
    check = sqlite3.connect(db)
    try:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        check.close()


async def test_an_in_memory_store_has_no_loop_writer(tmp_path: Path):
    async with await Store.open("sqlite+aiosqlite:///:memory:", loop_writes=True) as store:
        assert store.loop_writer is None


async def test_a_value_sqlite_cannot_take_leaves_no_transaction_open_on_the_loop(tmp_path: Path):
    # An int past 64 bits raises OverflowError in the sqlite3 module, inside the transaction that
    # stores a tool result with its audit row. Left open, that transaction would hold the write
    # lock and swallow the next calls' writes uncommitted.
    db = tmp_path / "s.db"
    async with await Store.open(f"sqlite:///{db}", loop_writes=True) as store:
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        with pytest.raises(Exception):  # noqa: B017  # the ordinary path's own error, whichever
            await store.add_message(conv.id, "tool", "out", tool_call_id="c1", audit=dict(
                user=user.key, skill="shell", arguments={}, decision="allowed", exit_status=0,
                duration_ms=5, output_bytes=2**64, detail=None))
        await store.add_message(conv.id, "user", "after")
        other = sqlite3.connect(db)
        try:  # committed, and the lock free for another connection
            assert other.execute("SELECT content FROM messages").fetchall() == [("after",)]
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
        finally:
            other.close()


async def _a_step_with_its_result(store: Store) -> list[Any]:
    """add_messages as the agent stores a step whose calls only read: the step, its first result
    and the call's audit row, one transaction; then two without an audit row."""
    user = await store.ensure_user("telegram", 1001)
    conv = await store.active_conversation(user.key, "1001")
    step_and_result = await store.add_messages(conv.id, [
        dict(role="assistant", content=SPECIAL, token_count=4, prompt_version="v1",
             tool_calls=[{"id": "c1", "function": {"name": "clock", "arguments": SPECIAL}}]),
        dict(role="tool", content=f"12:00 {SPECIAL}", tool_call_id="c1")],
        audit=dict(user=user.key, skill="clock", arguments={"tz": SPECIAL}, decision="allowed",
                   exit_status=0, duration_ms=1, output_bytes=12, detail=None))
    plain = await store.add_messages(conv.id, [dict(role="user", content="one"),
                                               dict(role="assistant", content="two")])
    return [step_and_result, plain]


async def test_add_messages_on_the_loop_stores_what_the_drivers_path_stores(tmp_path: Path):
    async def writes(store: Store) -> list[Any]:
        writer = store.loop_writer
        commits = writer.commits if writer is not None else 0
        records = await _a_step_with_its_result(store)
        if writer is not None:  # on the loop indeed: one commit a call
            assert writer.commits == commits + 2
        return records

    async def read(store: Store, records: list[Any]) -> list[Any]:
        return await store.list_messages(records[0][0].conversation_id)

    stored = await _on_each_path(tmp_path, writes, read)
    assert stored[True] == stored[False]
    audit = stored[True][2]["audit_log"]
    assert [m.id for m in stored[True][1]] == [1, 2, 3, 4] and len(audit) == 1


async def test_add_messages_to_an_unknown_conversation_writes_nothing_on_either_path(
        tmp_path: Path):
    for loop_writes in (True, False):
        db = tmp_path / f"{loop_writes}.db"
        async with await Store.open(f"sqlite:///{db}", loop_writes=loop_writes) as store:
            with pytest.raises(LookupError, match="conversation 999"):
                await store.add_messages(999, [
                    dict(role="assistant", content="step", tool_calls=[{"id": "c1"}]),
                    dict(role="tool", content="result", tool_call_id="c1")],
                    audit=dict(user="telegram:1", skill="clock", arguments={},
                               decision="allowed", exit_status=0, duration_ms=1,
                               output_bytes=6, detail=None))
            user = await store.ensure_user("telegram", 1001)
            conv = await store.active_conversation(user.key, "1001")
            with pytest.raises(ValueError, match="nobody"):  # a role it does not know: neither
                await store.add_messages(conv.id, [dict(role="user", content="fits"),
                                                   dict(role="nobody", content="bad")])
        rows = _rows(db)
        assert (rows["messages"], rows["audit_log"]) == ([], []), loop_writes


def _every_commit_grows(writer: Any) -> None:
    """Each commit on `writer` asks for a checkpoint, as one that grew the -wal file would."""
    committed = writer._committed

    def grew() -> None:
        committed()
        writer.checkpoint_due = True

    writer._committed = grew


async def test_a_checkpoint_started_as_the_last_one_ends_is_not_forgotten(tmp_path, monkeypatch):
    # The last one's done callback runs after a write that came in the same iteration started
    # the next: it must not clear the running one, which calls wait for and none runs beside.
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True)
    releases: list[asyncio.Event] = []
    try:
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        writer = store.loop_writer

        async def held(_writer: Any) -> None:
            release = asyncio.Event()
            releases.append(release)
            await release.wait()

        monkeypatch.setattr(store_base, "_checkpoint", held)
        _every_commit_grows(writer)
        store_base._start_checkpoint(store, writer)
        first = writer.checkpoint
        gate = asyncio.Event()

        async def a_turns_write() -> None:
            await gate.wait()
            await store.add_message(conv.id, "user", "hello")

        write = asyncio.ensure_future(a_turns_write())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        releases[0].set()  # the checkpoint ends; a write comes in the same iteration
        gate.set()
        await write
        await asyncio.sleep(0)
        assert first.done() and len(releases) == 2
        assert writer.checkpoint is not None and not writer.checkpoint.done()
    finally:
        for release in releases:
            release.set()
        await store.close()


async def test_close_returns_with_no_checkpoint_running_on_the_writers_connection(tmp_path):
    # A sent-mark waiting for a checkpoint wakes as the store closes: it starts none on the
    # connection being closed, and close waits for what the calls it waited for started.
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True)
    user = await store.ensure_user("telegram", 1001)
    conv = await store.active_conversation(user.key, "1001")
    event, _ = await store.record_inbound("telegram", 1, user.key, "1001", "hi")
    pieces = await store.add_reply("telegram", "1001", ["hello"], conversation_id=conv.id,
                                   answers=event.id)
    writer = store.loop_writer
    gate, calls = threading.Event(), []
    real = writer.checkpoint_passive

    def slow() -> None:
        calls.append(time.monotonic())
        gate.wait(5) if len(calls) == 1 else time.sleep(0.3)
        real()

    writer.checkpoint_passive = slow
    _every_commit_grows(writer)
    store_base._start_checkpoint(store, writer)
    sent = asyncio.ensure_future(store.mark_sent(pieces[0].id, 7))  # waits for it
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0.01)
    gate.set()
    await sent
    await closing
    assert writer.checkpoint is None or writer.checkpoint.done()


async def test_a_wal_started_over_after_a_burst_holds_up_no_write(tmp_path: Path):
    # SQLite cuts the file back only to journal_size_limit: one left larger than WAIT_BYTES by a
    # burst (a long reader held it) but reused from its start makes no call wait.
    db = tmp_path / "s.db"
    wal = Path(f"{db}-wal")
    async with await Store.open(f"sqlite:///{db}", loop_writes=True) as store:
        user = await store.ensure_user("telegram", 42)
        conv = await store.active_conversation(user.key, "42")
        await _written_behind_a_reader(db, store, conv.id, WAIT_BYTES + 1_000_000)
        writer = store.loop_writer
        for _ in range(6 * STAT_EVERY):
            await store.add_message(conv.id, "user", "hello")
            if writer.checkpoint is not None:
                await asyncio.wait({writer.checkpoint})
        check = sqlite3.connect(db)
        try:
            frames = check.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        finally:
            check.close()
        assert frames * 4096 < WAIT_BYTES  # started over
        assert wal.stat().st_size >= WAIT_BYTES  # the file kept its size
        assert not writer.too_long
