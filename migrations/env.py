"""Alembic environment for the OpenClaw store (async-capable, configured from code, no alembic.ini).

`openclaw.store.migrate` hands over an open connection in `config.attributes["connection"]`; the
plain `alembic` command line (with `sqlalchemy.url` set) gets an engine of its own instead.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from openclaw.store.engine import create_engine
from openclaw.store.models import Base, in_models

config = context.config
target_metadata = Base.metadata


def run_on(connection: Connection) -> None:
    if connection.dialect.name == "sqlite":
        # Python's sqlite3 begins a transaction by itself only before INSERT, UPDATE and DELETE,
        # so each CREATE would commit alone, and a migration cut short would leave tables without
        # their alembic_version row. One transaction makes it whole; IMMEDIATE takes the write
        # lock first, so two processes migrating at once take turns (the second finds it done).
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    # render_as_batch: SQLite alters tables by copying them; autogenerate must write it that way.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                      compare_type=True, include_name=in_models)
    with context.begin_transaction():
        context.run_migrations()


async def run_from_url(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(run_on)
            await connection.commit()
    finally:
        await engine.dispose()


def main() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=target_metadata, literal_binds=True,
                          dialect_opts={"paramstyle": "named"})
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
    elif url:
        asyncio.run(run_from_url(url))
    else:
        raise RuntimeError("no database to migrate: pass a connection or set sqlalchemy.url")


main()
