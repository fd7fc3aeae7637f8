"""Stores for tests: an empty one on either backend, and one an older daemon left behind."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from openclaw.store import Store, create_engine, migrate
from openclaw.store.models import Base


async def _empty_all_tables(store: Store) -> None:
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    async with store.engine.begin() as conn:
        await conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


@contextlib.asynccontextmanager
async def fresh_store(request: pytest.FixtureRequest, tmp_path: Path, **kw) -> AsyncIterator[Store]:
    """An empty store for one test, on the backend `request.param` names: a new SQLite file, or
    the session's PostgreSQL database (fixture `postgres`, tests/openclaw/conftest.py) emptied."""
    url = (f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}" if request.param == "sqlite"
           else request.getfixturevalue("postgres"))
    opened = await Store.open(url, **kw)
    if request.param == "postgresql":
        # One database for the session (migrated by the first open, a no-op after): emptying it is
        # ten times faster than creating a database per test.
        await _empty_all_tables(opened)
    try:
        yield opened
    finally:
        await opened.close()


async def left_at_revision(url: str, revision: str, *rows: tuple[str, tuple]) -> None:
    """A store an older daemon left: migrated to `revision` only, with `rows` (SQL, parameters)
    written in it as that schema's own."""
    engine = create_engine(url)
    try:
        await migrate(engine, revision)
        async with engine.begin() as conn:
            for sql, parameters in rows:
                await conn.exec_driver_sql(sql, parameters)
    finally:
        await engine.dispose()
