"""Applies the Alembic migrations in the repository's migrations/ folder, configured from code.

No alembic.ini: an ini's `fileConfig` would disable the daemon's loggers. The store hands Alembic
an open connection (Alembic's "connection sharing" recipe), so migrations run through the same
engine, pragmas and transaction as everything else, and in one transaction where the database
allows transactional DDL (SQLite and PostgreSQL both do; on SQLite, migrations/env.py has to begin
it itself).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from openclaw.store.engine import create_engine, normalize_url


def migrations_dir() -> Path:
    """The top-level migrations/ folder, found beside the `openclaw` package.

    This holds for a source checkout and an editable install (`pip install -e .`), which is how the
    daemon is installed. A wheel would not carry migrations/ (it is not a package); packaging one
    needs it mapped into the distribution first.
    """
    path = Path(__file__).resolve().parents[2] / "migrations"
    if not (path / "env.py").is_file():
        raise FileNotFoundError(
            f"Alembic migrations not found at {path}: install openclaw-py from a source checkout "
            "with `pip install -e .` so that migrations/ sits beside the openclaw package"
        )
    return path


def alembic_config(url: str | URL | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        # ConfigParser interpolates '%': escape it (percent-encoded passwords contain it).
        rendered = normalize_url(url).render_as_string(hide_password=False)
        cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def known_revisions() -> set[str]:
    """Every schema this version can upgrade from (one it does not know, a newer one made)."""
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _upgrade_on(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _current_on(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def migrate(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the database behind `engine` to `revision`; a database already there is left as is."""
    # Looked at first, by a read: an upgrade takes SQLite's write lock (migrations/env.py), which
    # every start and every CLI command opening the store would otherwise wait for, and fail on
    # after the busy timeout while another process writes long (`users forget`, a backup).
    if revision == "head" and await current_revision(engine) == head_revision():
        return
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade_on, revision)


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(_current_on)


def upgrade(url: str | URL, revision: str = "head") -> None:
    """Blocking: bring the database at `url` to `revision` (what `openclaw db upgrade` runs).

    From async code use `await migrate(engine)` or simply `await Store.open(url)`.
    """

    async def run() -> None:
        engine = create_engine(url)
        try:
            await migrate(engine, revision)
        finally:
            await engine.dispose()

    asyncio.run(run())
