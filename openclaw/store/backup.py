"""Backup and restore of a SQLite store with SQLite's online backup API (PostgreSQL has pg_dump).

The store runs in WAL mode: recent commits live in the -wal file, so a plain copy of the database
file, taken while the daemon writes, can miss them or be torn. The backup API copies the pages
of one read transaction instead: a consistent snapshot, while the daemon goes on writing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.request import pathname2url

from sqlalchemy.engine import URL

from openclaw.store.engine import BUSY_TIMEOUT_MS, normalize_url, sqlite_file
from openclaw.store.migrate import known_revisions

SQLITE_HEADER = b"SQLite format 3\x00"
# Tables every OpenClaw schema has had; a file without them is some other program's database.
_OUR_TABLES = {"alembic_version", "users", "conversations", "messages"}


class NotRestorable(ValueError):
    """The file is not an OpenClaw database this version can restore; the message says why."""


def sqlite_path(url: str | URL) -> Path:
    """The database file behind a store URL; ValueError, saying what to use, for any other store."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "postgresql":
        raise ValueError("the store is PostgreSQL: back it up with pg_dump and restore it with "
                         "pg_restore (or psql), e.g. pg_dump -Fc -f openclaw.dump DBNAME")
    path = sqlite_file(parsed)
    if path is None:
        raise ValueError("the store is not a file (an in-memory or URI database); there is nothing "
                         "to back up")
    return path


def backup(database: Path, dest: Path, *, force: bool = False) -> int:
    """Copy `database` to `dest` (mode 0600: it holds every conversation) as one consistent
    snapshot, even while a daemon writes to it; the size written. FileExistsError for an
    existing `dest` unless `force`."""
    if not database.is_file():
        raise FileNotFoundError(f"no database at {database}")
    if not dest.parent.is_dir():
        raise FileNotFoundError(f"no folder {dest.parent} to write the backup in; create it first")
    if dest.is_dir():
        raise IsADirectoryError(f"{dest} is a folder; give the backup's file name, e.g. "
                                f"{dest / 'openclaw-backup.db'}")
    # Not over the live database, nor its -wal or -shm: a daemon using it would go on writing
    # to the file unlinked from under it, and SQLite pairs a -wal with whatever file it finds.
    if dest.resolve() in {database.resolve().with_name(database.resolve().name + suffix)
                          for suffix in ("", "-wal", "-shm", "-journal")}:
        raise ValueError(f"{dest} is the database itself (or one of its files); give another path")
    if dest.exists() and not force:
        raise FileExistsError(f"{dest} exists; choose another name, or add --force to replace it")
    # Written beside dest, then renamed: an interrupted backup never leaves a torn file at dest,
    # where it would one day be restored.
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        with _connect(database, "rw") as src, _connect(tmp, "rw") as copy:
            src.backup(copy)  # all pages in one step: one read transaction, one snapshot
            # A backup of a WAL database is in WAL mode too; as a single self-contained file it
            # can be copied, archived or opened read-only without -wal and -shm beside it.
            copy.execute("PRAGMA journal_mode = DELETE")
        if force:
            os.replace(tmp, dest)
        else:
            os.link(tmp, dest)  # unlike a rename, never replaces a file made there meanwhile
    finally:
        tmp.unlink(missing_ok=True)
    return dest.stat().st_size


def revision_of(path: Path) -> str:
    """The schema revision of the OpenClaw database in `path`, checked whole and known to this
    version; NotRestorable saying why not."""
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise NotRestorable(f"cannot read {path}: {exc.strerror}") from None
    if header != SQLITE_HEADER:
        raise NotRestorable(f"{path} is not an SQLite database")
    try:
        with _connect(path, "ro") as db:
            tables = {name for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if missing := sorted(_OUR_TABLES - tables):
                raise NotRestorable(f"{path} is not an OpenClaw database (no table "
                                    f"{', '.join(missing)})")
            check = [row[0] for row in db.execute("PRAGMA quick_check")]
            if check != ["ok"]:
                raise NotRestorable(f"{path} is damaged ({check[0]}); restore another backup")
            revision = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.OperationalError as exc:  # locked, or its folder not ours to write
        raise NotRestorable(f"cannot read {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:  # too damaged to read its table list (a cut-off copy)
        raise NotRestorable(f"{path} is damaged ({exc}); restore another backup") from None
    if revision is None:
        raise NotRestorable(f"{path} has no schema version; it is not a database OpenClaw made")
    if revision[0] not in known_revisions():
        raise NotRestorable(f"{path} is at schema {revision[0]}, which this openclaw does not know "
                            "(a newer version made it); upgrade openclaw first")
    return revision[0]


def restore(source: Path, database: Path) -> None:
    """Replace the content of `database` with that of `source` (check it with `revision_of`
    first). Through the backup API, into the database itself: one write transaction, so a reader
    sees the old database or the new one, and the old one's -wal is dealt with, not replayed over
    the new file as it would be after a plain copy."""
    with contextlib.suppress(FileExistsError):  # like the store's own file: the owner's alone
        os.close(os.open(database, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    with _connect(source, "ro") as src, _connect(database, "rw") as db:
        src.backup(db)


@contextlib.contextmanager
def _connect(path: Path, mode: str) -> Iterator[sqlite3.Connection]:
    # mode=rw|ro never creates a file that is not there (a mistyped path is an error, not a new
    # empty database); the busy timeout waits out a daemon's checkpoint, as the store does.
    conn = sqlite3.connect(f"file:{pathname2url(str(path))}?mode={mode}", uri=True,
                           timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        yield conn
    finally:
        conn.close()
