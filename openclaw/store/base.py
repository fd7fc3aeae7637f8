"""What every part of the Store shares: the engine, one short transaction per call, the clock, and
running each call whole (`run_whole`). The parts (users.py, conversations.py, journal.py,
reminders.py, usage.py) subclass `StoreBase`; store.py joins them into the `Store`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Self, TypeVar

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from openclaw.store.loop_writer import NOT_DONE, LoopWriter, Step
from openclaw.store.sqlite_driver import OneTripConnection
from sandbox.to_end import run_to_end

CLOSE_WAIT_S = 15.0  # close waits this long at most for calls still running

Clock = Callable[[], datetime]
R = TypeVar("R")
S = TypeVar("S", bound="StoreBase")


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_record(cls: type[R], row: Any, **extra: Any) -> R:
    """The frozen record `cls` (records.py) of an ORM row, with `extra` for fields it lacks."""
    values = {f.name: getattr(row, f.name) for f in fields(cls) if f.name not in extra}
    return cls(**values, **extra)


async def commits_next(session: AsyncSession) -> None:
    """The session's next statement is its transaction's last: on SQLite it commits the
    transaction itself, on the driver's thread in the same trip, and the session's commit costs
    none (sqlite_driver). Only where nothing after that statement can fail and roll back: what it
    wrote is committed as it returns. Nothing on PostgreSQL."""
    if session.bind.dialect.name != "sqlite":
        return
    driver = (await (await session.connection()).get_raw_connection()).driver_connection
    if isinstance(driver, OneTripConnection):
        driver.commit_next = True


async def insert_values(session: AsyncSession, model: type, last: bool = False,
                        **values: Any) -> Any:
    """INSERT one row as a plain statement; the result. For rows written on every turn: the ORM's
    unit of work (add, flush, identity map) costs more than the statement itself. `last`: the
    transaction's last statement (commits_next)."""
    if last:
        await commits_next(session)
    return await session.execute(_insert_statement(model), _parameters(model, values))


async def insert_record(session: AsyncSession, model: type, record: type[R], last: bool = False,
                        **values: Any) -> R:
    """`insert_values`, returned as `record` (`values` plus the new id: SQLite gives it from the
    cursor, PostgreSQL by RETURNING)."""
    result = await insert_values(session, model, last, **values)
    return record(id=result.inserted_primary_key[0], **values)


def _parameters(model: type, values: dict[str, Any]) -> dict[str, Any]:
    """Values by attribute name to parameters by column (AuditRow.user is column "user_key")."""
    keys = _column_keys(model)
    return {keys[key]: value for key, value in values.items()}


@functools.cache
def _column_keys(model: type) -> dict[str, str]:
    return {key: column.key for key, column in model.__mapper__.columns.items()}


def loop_insert(writer: LoopWriter, model: type, values: dict[str, Any]) -> Step:
    """`insert_values` as a step for the loop's writer (loop_writer): the same INSERT."""
    parameters = _parameters(model, values)
    return writer.prepare(("insert", model, tuple(parameters)), lambda: _insert_statement(model),
                          tuple(parameters)), parameters


@functools.cache
def _insert_statement(model: type) -> Any:
    # Built once: a statement made per call spends more on construction and its cache key than on
    # the INSERT; the values go in as parameters.
    return insert(model.__table__)


class StoreBase:
    """The engine and its sessions, the clock, and the calls running now (see `run_whole`)."""

    def __init__(self, engine: AsyncEngine, *, clock: Clock | None = None,
                 loop_writer: LoopWriter | None = None):
        self.engine = engine
        # SQLite: the per-turn writes' connection on the event loop's thread (loop_first).
        self.loop_writer = loop_writer
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or utcnow
        self._calls: set[asyncio.Task[Any]] = set()  # running, each in a task of its own

    async def close(self) -> None:
        # Calls still running finish first (up to a limit: a hung server must not hang a stop):
        # disposed under them, their connections would be terminated mid-transaction. wait, not
        # gather, which would cancel them if this is cancelled.
        # The loop's writer first: a call that wakes now takes the thread's path, and starts no
        # checkpoint on a connection about to close.
        writer, self.loop_writer = self.loop_writer, None
        deadline = asyncio.get_running_loop().time() + CLOSE_WAIT_S
        while self._calls and (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.wait(self._calls, timeout=left)  # and those the waited ones started
        if writer is not None:
            # On a thread: were it the file's last connection, closing would checkpoint (fsync).
            await asyncio.to_thread(writer.close)
        await self.engine.dispose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the store's clock returned a naive datetime; it must return UTC-aware ones")
        return now

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session in one transaction: committed at the end, rolled back on an error."""
        async with self._sessions() as session, session.begin():
            yield session

    async def retrying(self, op: Callable[[AsyncSession], Awaitable[R]], attempts: int = 3) -> R:
        """Run `op` in a transaction, again if a concurrent writer won a unique index first.

        The retry then finds the winner's row (get-or-create) or draws a fresh value (codes).
        """
        for attempt in range(attempts):
            try:
                async with self.transaction() as session:
                    return await op(session)
            except IntegrityError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")


def loop_first(on_loop: Callable[..., Any], *, steps: tuple[str, ...] = (),
               after_reply: bool = False, reads: bool = False
               ) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Marks a Store call whose `on_loop(store, writer, *args, **kwargs)` makes the same writes
    on the loop's writer (loop_writer), synchronously: the call's result, or NOT_DONE when the
    writer could not (the call then runs as it is). run_whole tries it first. `steps`: the
    store's methods the ordinary path runs that `on_loop` stands in for; where a class overrides
    one (a wrapper, a test holding the call there), the call takes the ordinary path.
    `after_reply`: the call is made once the user has their reply (a delivery's sent-mark, made
    under the chat's lock only), where waiting costs them nothing: it lets a running checkpoint
    finish first, so that its write starts the -wal file over (see _start_checkpoint). Not for a
    call made under a lock that turns before their reply take (Spending's: usage, trace).
    `reads`: `on_loop` only reads (LoopWriter.read): it waits for no checkpoint."""
    def mark(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        method.on_loop = on_loop, steps, after_reply, reads  # type: ignore[attr-defined]
        return method
    return mark


def memory_first(in_memory: Callable[..., Any]
                 ) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Marks a Store call whose `in_memory(store, *args, **kwargs)` answers it from what the
    store keeps, or gives NOT_DONE (the call then runs as it is): answered so, it needs no task
    of its own (run_whole), which is a loop iteration and tens of microseconds."""
    def mark(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        method.in_memory = in_memory  # type: ignore[attr-defined]
        return method
    return mark


async def _checkpoint(writer: LoopWriter) -> None:
    """A PASSIVE checkpoint on a worker thread (the loop's writer makes none): it copies what no
    reader still needs into the database file, so the -wal file is reused, not grown."""
    # One that fails (the store closing) is made good by the next, or by the thread's connections,
    # which checkpoint on their own commits.
    with contextlib.suppress(sqlite3.Error):
        await asyncio.to_thread(writer.checkpoint_passive)


def _start(store: StoreBase, work: Awaitable[R]) -> asyncio.Task[R]:
    task = asyncio.ensure_future(work)
    store._calls.add(task)
    task.add_done_callback(store._calls.discard)
    return task


def _start_checkpoint(store: StoreBase, writer: LoopWriter) -> None:
    """The checkpoint a commit on the loop asked for, on the thread, unless one runs already (a
    later commit asks again). No call waits for it on the way to a reply: the writes go on
    beside it, which leaves it short of the -wal file's end, so that the file cannot start over;
    the calls made after a reply (loop_first's after_reply) wait for it to finish, and a write
    after that starts the file over. Every call waits while the file grows past WAIT_BYTES."""
    if writer.checkpoint is not None and not writer.checkpoint.done():
        return
    writer.checkpoint_due = False
    writer.checkpoint = _start(store, _checkpoint(writer))

    def ended(task: asyncio.Task[None]) -> None:
        if writer.checkpoint is task:  # not a later one, started before this callback ran
            writer.checkpoint = None

    writer.checkpoint.add_done_callback(ended)


def run_whole(method: Callable[..., Awaitable[R]],
              steps: dict[str, Any] | None = None) -> Callable[..., Awaitable[R]]:
    """Runs a Store call in a task of its own, which a cancel of its caller does not reach: the
    call commits or rolls back whole, and only then does its caller get the cancel, so what it
    wrote is known to be there. (Cut short inside a statement, SQLAlchemy terminates the
    connection as broken, and a second cancel during that leaks it.) About 25 us a call.
    A memory_first call answered from memory, and a loop_first call that its writer finishes,
    need no task: each ran whole, synchronously. `steps`: the loop_first call's steps by name,
    as the class defined them."""
    on_loop, _steps, after_reply, reads = getattr(method, "on_loop", (None, (), False, False))
    in_memory = getattr(method, "in_memory", None)
    own = list((steps or {}).items())

    @functools.wraps(method)
    async def call(self: StoreBase, *args: Any, **kwargs: Any) -> R:
        if in_memory is not None and (done := in_memory(self, *args, **kwargs)) is not NOT_DONE:
            return done
        writer = self.loop_writer
        if (on_loop is not None and writer is not None and writer.thread == threading.get_ident()
                and all(getattr(type(self), name) is step for name, step in own)):
            while ((after_reply or writer.too_long) and not reads
                   and writer.checkpoint is not None and not writer.checkpoint.done()):
                # Nothing written yet: a cancel here loses nothing. `wait`, not `shield`: the
                # checkpoint's own failure or cancel is not this call's.
                await asyncio.wait({writer.checkpoint})
            if self.loop_writer is writer:  # not closed meanwhile
                done = on_loop(self, writer, *args, **kwargs)
                if done is not NOT_DONE:
                    if writer.checkpoint_due:
                        _start_checkpoint(self, writer)
                    return done
        return await run_to_end(_start(self, method(self, *args, **kwargs)))
    return call


def calls_run_whole(cls: type[S]) -> type[S]:
    """Sets on `cls` each public coroutine method of its parts, wrapped by `run_whole`; not
    StoreBase's own (close waits for the calls, `retrying` runs inside one)."""
    for name in dir(cls):
        method = inspect.getattr_static(cls, name)
        if (not name.startswith("_") and name not in vars(StoreBase)
                and inspect.iscoroutinefunction(method)):
            steps = getattr(method, "on_loop", (None, (), False, False))[1]
            setattr(cls, name, run_whole(method, {step: getattr(cls, step) for step in steps}))
    return cls
