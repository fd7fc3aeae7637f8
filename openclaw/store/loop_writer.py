"""SQLite: the store's per-turn writes (and a turn's memory recall, `LoopWriter.read`) run on the
event loop's own thread, on a connection of their own, without a trip to aiosqlite's thread.

A short INSERT or UPDATE and its COMMIT take tens of microseconds in WAL mode with
synchronous=NORMAL (a commit appends to the -wal file and does not fsync), less than one hop to
aiosqlite's thread and back through SQLAlchemy's session. The calls that use this
(base.loop_first) try it first and fall back to their ordinary path, the same statements on the
thread, whenever it cannot finish at once. What keeps the loop from blocking:

- busy_timeout 0: when another connection holds the write lock (this process's aiosqlite
  connection inside a transaction, or another process: the CLI, a backup), the write fails at
  once, is rolled back, and the call runs on the thread, which waits for the lock there;
- wal_autocheckpoint 0: a commit here never checkpoints (that fsyncs); a commit that grew the
  -wal file past CHECKPOINT_BYTES (SQLite's own threshold, 1000 pages) starts a PASSIVE
  checkpoint on a worker thread, which no write before a reply waits for: the writes go on
  beside it (a checkpoint takes no lock a writer needs); the delivery's sent-mark, made once the
  reply is out, waits for it, so that the next write starts the file over. Only a file growing
  past WAIT_BYTES (writes faster than checkpoints, for long) makes every call wait for the
  running one, off the loop (base.run_whole), which bounds it; the thread's own connections keep
  checkpointing as before;
- one writer at a time without a deadlock: a transaction here runs from BEGIN to COMMIT in one
  synchronous call, so it never holds the write lock across an await, and never waits for one.

Same statements as the ordinary path (the Core statements it runs, compiled once for SQLite with
the same column types, so every value is stored as it would be there), same transactions, same
durability: what a call returns is committed, and survives the process being killed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

from openclaw.store import engine as store_engine

# A commit that grows the -wal file past this asks for a checkpoint: SQLite's automatic one comes
# at 1000 pages. A file that no longer grows is being reused from its start after a checkpoint.
CHECKPOINT_BYTES = 1000 * 4096
# And a checkpoint at least every so many commits here (a turn makes about six): the file's size
# alone misses the frames appended into a -wal file already that large.
CHECKPOINT_COMMITS = 1000
STAT_EVERY = 4  # commits between looks at the -wal file's size
# A -wal file growing past this makes every call wait for the running checkpoint, so that its
# write starts the file over. Below it only the sent-mark waits: a checkpoint's fsyncs take
# milliseconds, a turn's writes the slowest one in a hundred (issue 30's p99) if they waited.
WAIT_BYTES = 4 * CHECKPOINT_BYTES

# Reads on the loop (LoopWriter.read) stop past this and run on the thread instead: a recall in
# a small memory takes tens of microseconds; in a large one, a search could hold every turn up.
READ_BUDGET_S = 0.002
PROGRESS_STEPS = 2000  # SQLite VM instructions between looks at the clock while reading

Step = tuple["Prepared", dict[str, Any]]
T = TypeVar("T")
# What a call's part on the loop returns when it did not write there: the call then runs its
# ordinary path (base.loop_first).
NOT_DONE: Any = object()


class StandAside(Exception):
    """Raised in a transaction's body (LoopWriter.transaction): roll back, and let the call's
    ordinary path run."""


class Prepared:
    """A Core statement compiled once for SQLite: its SQL, and for each `?` in order the
    parameter's name, its value when the statement carries one, and its type's bind processor
    (what SQLAlchemy applies: aware datetimes to UTC text, enums to their value, JSON dumped)."""

    def __init__(self, statement: ClauseElement, dialect: Dialect,
                 column_keys: Sequence[str] | None = None):
        compiled = statement.compile(dialect=dialect, column_keys=list(column_keys or ()) or None)
        if compiled.positiontup is None:
            raise ValueError(f"not a positional statement for SQLite: {compiled.string}")
        self.sql = compiled.string
        self._order: list[tuple[str, bool, Any, Any]] = []
        for name in compiled.positiontup:
            bind = compiled.binds[name]
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            self._order.append((name, bind.required, bind.value, processor))
        # A None is bound as itself where each processor makes it None (all the store's types:
        # NULL), a third of a turn's values: the processors' calls are most of binding a row.
        try:
            self._none_as_is = all(p is None or p(None) is None for *_, p in self._order)
        except Exception:
            self._none_as_is = False
        # A SELECT's columns: each one's key and result processor (what SQLAlchemy applies to
        # what it reads: UTC text to aware datetimes, 0/1 to bools, text to enums).
        # (None for a text statement: its rows are read as SQLite gives them.)
        selected = getattr(statement, "selected_columns", None)
        self.keys = None if selected is None else [c.key for c in selected]
        self._read = None if selected is None else [
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in selected]

    def rows(self, fetched: list[tuple]) -> list[tuple]:
        """A SELECT's fetched rows, each value as SQLAlchemy would read it (in `keys` order)."""
        if self._read is None:
            return fetched
        processors = self._read
        return [tuple(value if process is None or value is None else process(value)
                      for process, value in zip(processors, row, strict=True)) for row in fetched]

    def parameters(self, values: dict[str, Any]) -> tuple[Any, ...]:
        out = []
        as_is = self._none_as_is
        for name, required, default, processor in self._order:
            value = values[name] if required else values.get(name, default)
            out.append(value if processor is None or (value is None and as_is)
                       else processor(value))
        return tuple(out)


class LoopWriter:
    """One plain sqlite3 connection to the store's file, used on the event loop's thread only
    (closed from another: see close)."""

    def __init__(self, path: Path, dialect: Dialect):
        self._dialect = dialect
        # The thread of the loop that opened the store: a transaction here is a run of calls on
        # one connection, which a second thread must not interleave with its own.
        self.thread = threading.get_ident()
        self._prepared: dict[Any, Prepared] = {}
        self.commits = 0
        self.checkpoint_due = False  # set by a commit that grew the -wal file; the store runs it
        self.checkpoint: Any = None  # the store's task running it, on the thread (base.run_whole)
        self.too_long = False  # the -wal file grew past WAIT_BYTES: the next call waits for it
        self._path = path
        self._checkpointer: sqlite3.Connection | None = None  # checkpoint's, on a worker thread
        self._checkpointing = threading.Lock()  # the checkpoint's connection, one thread at a time
        self._wal = f"{path}-wal"
        self._wal_size = 0
        self._since_checkpoint = 0
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        try:
            # journal_size_limit as the thread's connections have it: this connection, too, may be
            # the writer that starts the -wal file over, and cuts it back then.
            for pragma in ("busy_timeout = 0", "synchronous = NORMAL", "foreign_keys = ON",
                           "wal_autocheckpoint = 0",
                           f"journal_size_limit = {int(store_engine.JOURNAL_SIZE_LIMIT)}"):
                self._conn.execute(f"PRAGMA {pragma}")
            mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        except BaseException:
            self._conn.close()
            raise
        if mode != "wal":
            # Outside WAL a commit fsyncs and a writer blocks readers: not for the loop.
            self._conn.close()
            raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal")

    @classmethod
    def open(cls, path: Path, dialect: Dialect) -> LoopWriter | None:
        """The writer, or None where it cannot be had (the store then runs every call on its
        thread, as it does on PostgreSQL)."""
        try:
            return cls(path, dialect)
        except sqlite3.Error:
            return None

    def prepare(self, key: Any, build: Callable[[], ClauseElement],
                column_keys: Sequence[str] | None = None) -> Prepared:
        """The statement `build` makes, compiled the first time `key` is asked for."""
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepared[key] = Prepared(build(), self._dialect, column_keys)
        return prepared

    def write(self, steps: Sequence[Step]) -> list[tuple[int, int | None]] | None:
        """Run `steps` as one transaction, committed before this returns: (rowcount, lastrowid) of
        each. None, with nothing written, when it could not run here (the lock is held elsewhere,
        a constraint failed, a value is refused): the caller's ordinary path then runs the same
        statements and meets the same condition in its own way (waits, or raises its error)."""
        try:
            parameters = [prepared.parameters(values) for prepared, values in steps]
        except Exception:  # the ordinary path raises it, as SQLAlchemy words it
            return None
        conn, many = self._conn, len(steps) > 1
        done = []
        try:
            if many:
                conn.execute("BEGIN IMMEDIATE")
            for (prepared, _values), bound in zip(steps, parameters, strict=True):
                cursor = conn.execute(prepared.sql, bound)
                done.append((cursor.rowcount, cursor.lastrowid))
            if many:
                conn.execute("COMMIT")
        except BaseException as exc:
            # Whatever it was, the transaction goes: left open, it would hold the write lock and
            # make the next call's statements part of it, uncommitted.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, (sqlite3.Error, OverflowError)):
                return None  # the ordinary path meets it again, and says so its own way
            raise
        self._committed()
        return done

    def _committed(self) -> None:
        self.commits += 1
        self._since_checkpoint += 1
        # The file's size every few commits (a stat is microseconds, a turn makes six commits of
        # a few pages each): a threshold is passed by at most a few commits' pages.
        if self.commits % STAT_EVERY and self._since_checkpoint < CHECKPOINT_COMMITS:
            return
        try:
            size = os.stat(self._wal).st_size
        except OSError:
            size = 0
        # Grown past the threshold, or reused from its start after a checkpoint for as many
        # commits as grew it that far once: a -wal file left large (a long reader held it) is
        # not waited out whole before the next checkpoint.
        grown = size >= CHECKPOINT_BYTES and size > self._wal_size
        self.checkpoint_due = grown or self._since_checkpoint >= CHECKPOINT_COMMITS
        if self.checkpoint_due:
            self._since_checkpoint = 0
        # Growing past it: a file left that large (SQLite cuts it back only to
        # journal_size_limit) but reused from its start holds up no call.
        self.too_long = size >= WAIT_BYTES and size > self._wal_size
        self._wal_size = size

    def transaction(self, body: Callable[[Callable[[Prepared, dict[str, Any]], sqlite3.Cursor]], T]
                    ) -> T:
        """`body(execute)` in one transaction (BEGIN IMMEDIATE: the write lock from the start, so
        its reads are those of the writer), committed before this returns: body's result. NOT_DONE,
        with nothing written, where `write` gives None, or where body raises StandAside."""
        conn = self._conn
        done = self._within("BEGIN IMMEDIATE", body, lambda prepared, values: conn.execute(
            prepared.sql, prepared.parameters(values)))
        if done is not NOT_DONE:
            self._committed()
        return done

    def read(self, body: Callable[[Callable[[Prepared, dict[str, Any]], list[tuple]]], T],
             budget_s: float | None = None) -> T:
        """`body(query)` in one read transaction (a snapshot: it waits for no lock, and holds up
        no writer): `query(prepared, values)` gives a SELECT's rows (Prepared.rows). NOT_DONE
        where a statement fails, or the reads run past `budget_s` (READ_BUDGET_S by default: a
        progress handler interrupts them): the caller's ordinary path then runs them on the
        thread, where a long search holds up no other turn."""
        conn = self._conn
        deadline = time.perf_counter() + (READ_BUDGET_S if budget_s is None else budget_s)
        conn.set_progress_handler(lambda: time.perf_counter() > deadline, PROGRESS_STEPS)
        try:
            return self._within("BEGIN", body, lambda prepared, values: prepared.rows(
                conn.execute(prepared.sql, prepared.parameters(values)).fetchall()))
        finally:
            conn.set_progress_handler(None, 0)

    def _within(self, begin: str, body: Callable[[Callable[..., Any]], T],
                run: Callable[[Prepared, dict[str, Any]], Any]) -> T:
        """`body(run)` between `begin` and COMMIT; NOT_DONE, rolled back, where SQLite or a
        value refuses it (or body raises StandAside). Never left open: an open transaction would
        make the next call's statements part of it, uncommitted."""
        conn = self._conn
        try:
            conn.execute(begin)
            done = body(run)
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, (sqlite3.Error, StandAside, KeyError, ValueError, TypeError,
                                OverflowError, IndexError)):
                return NOT_DONE
            raise
        return done

    def pragma(self, name: str) -> Any:
        """A setting of this connection (`busy_timeout`, `wal_autocheckpoint`): what it runs with."""
        return self._conn.execute(f"PRAGMA {name}").fetchone()[0]

    def checkpoint_passive(self) -> None:
        """A PASSIVE checkpoint, on a worker thread (base._checkpoint), on a connection of its
        own: one trip from the loop, where the driver's path takes one per statement and more to
        check a connection out and back. Never two at once (the store starts one at a time)."""
        with self._checkpointing:
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(str(self._path), isolation_level=None,
                                                     check_same_thread=False)
            self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def close(self) -> None:
        with self._checkpointing:  # after a checkpoint still running on a worker thread
            if self._checkpointer is not None:
                self._checkpointer.close()
        self._conn.close()
