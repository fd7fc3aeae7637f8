"""aiosqlite, with one trip to its thread per statement instead of four.

aiosqlite runs each sqlite3 call on a thread of its own, about 55 us a trip through the event loop;
SQLAlchemy's adapter makes four for every statement (make a cursor, execute, fetch, close), most of
the store's share of a turn. The cursor here does all four on the thread in one trip and hands
SQLAlchemy the rows it already has.

Only `openclaw.store.engine` uses this, through SQLAlchemy's `async_creator_fn` connect argument,
which keeps the rest of the aiosqlite dialect (URL handling, errors, pool, terminate) as it is.
It relies on two attributes of aiosqlite's Connection that are not public API: `_execute` (queue a
function on the connection's thread) and `_conn` (the sqlite3 connection, used only on that
thread), and on how SQLAlchemy 2.1's adapter uses a cursor (`cursor()` called, not awaited, then
`__aenter__`; 2.0 awaited `cursor()`): pyproject pins the aiosqlite and SQLAlchemy versions it was
checked against.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from typing import Any

import aiosqlite


def _run_on_thread(connection: aiosqlite.Connection, many: bool, sql: str, parameters: Any,
                   commit: bool) -> tuple[list[Any], Any, int, int | None]:
    """One statement from start to end on aiosqlite's thread: rows and the cursor's attributes;
    with `commit`, the transaction committed after it, in the same trip."""
    cursor = connection._conn.cursor()
    try:
        if many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, parameters)
        rows = cursor.fetchall() if cursor.description is not None else []
        if commit:
            connection._conn.commit()
        return rows, cursor.description, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class OneTripCursor:
    """What SQLAlchemy's adapter uses of an aiosqlite cursor. Each execute runs to the end on the
    connection's thread; the fetch methods then hand out the rows kept, without a trip."""

    arraysize = 1

    def __init__(self, connection: aiosqlite.Connection):
        self._connection = connection
        self._rows: deque[Any] = deque()
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None

    async def __aenter__(self) -> OneTripCursor:  # what the adapter awaits on a new cursor
        return self

    async def _run(self, many: bool, sql: str, parameters: Any) -> OneTripCursor:
        connection = self._connection
        commit, connection.commit_next = connection.commit_next, False
        rows, self.description, self.rowcount, self.lastrowid = await connection._execute(
            _run_on_thread, connection, many, sql, parameters, commit)
        self._rows = deque(rows)
        return self

    async def execute(self, sql: str, parameters: Any = ()) -> OneTripCursor:
        return await self._run(False, sql, parameters)

    async def executemany(self, sql: str, parameters: Any) -> OneTripCursor:
        return await self._run(True, sql, parameters)

    async def fetchone(self) -> Any:
        return self._rows.popleft() if self._rows else None

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        count = min(len(self._rows), self.arraysize if size is None else size)
        return [self._rows.popleft() for _ in range(count)]

    async def fetchall(self) -> list[Any]:
        rows = list(self._rows)
        self._rows.clear()
        return rows

    async def close(self) -> None:
        self._rows.clear()


class OneTripConnection(aiosqlite.Connection):
    # Set by the store (base.commits_next) for the last statement of a transaction: it commits
    # on the thread, in its own trip, and the commit that follows finds nothing left to do.
    commit_next = False

    def cursor(self) -> OneTripCursor:  # type: ignore[override]  # no trip: nothing made on the thread yet
        return OneTripCursor(self)

    # No trip when no transaction is open: one committed by its last statement, or one that
    # only read (the driver begins a transaction only before a write). The flag is read here,
    # off the thread, only while no statement of this connection runs (each is awaited).
    async def commit(self) -> None:
        if self._conn.in_transaction:
            await super().commit()

    async def rollback(self) -> None:
        if self._conn.in_transaction:
            await super().rollback()


def connect(database: str, **kwargs: Any) -> OneTripConnection:
    """What SQLAlchemy's aiosqlite dialect calls (`async_creator_fn`) with the arguments it made
    from the URL; it awaits the result, which opens the database on the connection's thread."""
    connection = OneTripConnection(lambda: sqlite3.connect(database, **kwargs), iter_chunk_size=64)
    # As SQLAlchemy does for aiosqlite's own connections: a connection nobody closed must not keep
    # the interpreter from exiting.
    connection._thread.daemon = True
    return connection
