"""Creates the async engine for a store URL: aiosqlite with WAL and its pragmas, or asyncpg as is.

Everything SQLite-specific in the store lives here, in the connect and begin hooks; queries elsewhere
are plain SQLAlchemy that PostgreSQL runs unchanged.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from openclaw.store import sqlite_driver

BUSY_TIMEOUT_MS = 10_000
# The -wal file is cut back to this size whenever a checkpoint has emptied it; without a limit it
# keeps the largest size it ever reached (a long-held read snapshot, a backup, lets it grow by every
# write meanwhile). Normal use stays at 4 to 10 MiB, so no periodic TRUNCATE checkpoint is needed.
JOURNAL_SIZE_LIMIT = 64 * 2**20

# What a user may write in the config, mapped to the async driver the store needs.
_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
}


def normalize_url(url: str | URL) -> URL:
    """`sqlite:///x.db` -> `sqlite+aiosqlite:///x.db`, `postgresql://` -> `postgresql+asyncpg://`."""
    parsed = make_url(url)
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    if parsed.drivername not in ("sqlite+aiosqlite", "postgresql+asyncpg"):
        raise ValueError(
            f"store url {parsed.render_as_string(hide_password=True)!r}: the store supports "
            "'sqlite+aiosqlite:///PATH' and 'postgresql+asyncpg://USER@HOST/DB'"
        )
    return parsed


def sqlite_file(url: URL) -> Path | None:
    """The database file of a store URL (normalized); None for an in-memory or URI SQLite
    database, and for a server's (PostgreSQL), which has no file here."""
    db = url.database
    if url.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:") \
            or url.query.get("uri"):
        return None
    return Path(db).expanduser()


def create_engine(url: str | URL, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
                  echo: bool = False) -> AsyncEngine:
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_async_engine(parsed, echo=echo, pool_pre_ping=True)
    path = sqlite_file(parsed)
    if path is not None:
        # The default lives under ~/.local/share/openclaw/, which a first run has not created yet.
        # Every conversation is in there: the folder and the file are the owner's alone, whichever
        # command creates them first (SQLite's -wal and -shm files take the file's mode).
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):  # never touches an existing one (its owner's)
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        parsed = parsed.set(database=str(path))
    # Every store call ends its transaction itself (commit, or rollback on error), so the pool's
    # extra ROLLBACK on each check-in would only cost a round trip to the driver thread.
    engine = create_async_engine(parsed, echo=echo, pool_reset_on_return=None,
                                 connect_args={"async_creator_fn": sqlite_driver.connect})
    _install_sqlite_hooks(engine, busy_timeout_ms)
    return engine


def _install_sqlite_hooks(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Pragmas run outside a transaction, so transaction control is switched on after them.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # busy_timeout first: switching a fresh file to WAL needs a lock another process may hold.
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute(f"PRAGMA journal_size_limit = {int(JOURNAL_SIZE_LIMIT)}")
        finally:
            cursor.close()
        # The driver opens "BEGIN IMMEDIATE" itself right before a transaction's first write:
        # the write lock is taken up front (a busy writer is waited for, never a failed lock
        # upgrade), and no separate round trip to aiosqlite's thread is spent on BEGIN. Reads
        # before that first write run on their own snapshot; the get-or-create paths that read
        # then write rely on unique indexes and retry (Store.retrying), not on the snapshot.
        dbapi_connection.isolation_level = "IMMEDIATE"
