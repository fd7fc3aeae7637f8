"""`openclaw db ...`: the store's schema (upgrade), and its backup and restore.

A backup is taken with SQLite's online backup API, so it is consistent while the daemon runs. A
restore replaces the whole database (every user, conversation, reminder), so it refuses while a
daemon uses the data_dir (a running daemon keeps conversations in memory), asks first, and keeps
what the database held before beside it. A PostgreSQL store has pg_dump and pg_restore for this.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from datetime import datetime
from pathlib import Path

from openclaw.config import load_config
from openclaw.users_cli import confirmed, data_dir_held


def add_commands(sub, common_sub) -> None:
    db = common_sub(sub.add_parser("db", help="database maintenance").add_subparsers(
        dest="db_cmd", required=True))
    db.add_parser("upgrade", help="apply migrations").set_defaults(func=cmd_db_upgrade)
    p = db.add_parser("backup", help="copy the database to PATH (mode 0600), consistent while the "
                                     "daemon runs")
    p.add_argument("path", type=Path)
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_db_backup)
    p = db.add_parser("restore", help="replace the database with the backup at PATH (the daemon "
                                      "must be stopped; the current one is kept beside it)")
    p.add_argument("path", type=Path)
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.set_defaults(func=cmd_db_restore)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from openclaw.store import upgrade

    config = load_config(args.config)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    upgrade(config.store.url)
    print("database is at the latest schema")
    return 0


def cmd_db_backup(args: argparse.Namespace) -> int:
    from openclaw.store.backup import backup, sqlite_path

    config = load_config(args.config)
    dest = args.path.expanduser().absolute()
    try:
        database = sqlite_path(config.store.url)
        size = backup(database, dest, force=args.force)
    except (ValueError, OSError, sqlite3.Error) as exc:
        print(f"openclaw db backup: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {dest} ({_size(size)}, mode 0600: it holds every conversation)\n"
          f"restore it with: openclaw db restore {dest}")
    return 0


def cmd_db_restore(args: argparse.Namespace) -> int:
    from openclaw.store import head_revision, upgrade
    from openclaw.store.backup import backup, restore, revision_of, sqlite_path

    config = load_config(args.config)
    source = args.path.expanduser().absolute()
    try:
        database = sqlite_path(config.store.url)
        if source.exists() and database.exists() and source.samefile(database):
            raise ValueError(f"{source} is the database itself; give a backup's path")
        revision = revision_of(source)
    except ValueError as exc:  # NotRestorable too
        print(f"openclaw db restore: {exc}", file=sys.stderr)
        return 1
    with data_dir_held(config) as running:
        if running:
            print(f"openclaw db restore: {running}; stop it, restore, then start it again",
                  file=sys.stderr)
            return 1
        if not confirmed("openclaw db restore", f"Replace {database} (every user, conversation and "
                         f"reminder in it) with {source}?", args.yes):
            return 1
        saved = None
        try:
            if database.is_file() and database.stat().st_size:
                saved = database.with_name(
                    f"{database.name}.before-restore-{datetime.now():%Y%m%d-%H%M%S}")
                backup(database, saved)
            restore(source, database)
        except (OSError, sqlite3.Error) as exc:
            print(f"openclaw db restore: {exc}", file=sys.stderr)
            return 1
        upgrade(config.store.url)  # a backup of an older schema is brought to this version's
    head = head_revision()
    print(f"restored {database} from {source} (schema {revision}"
          + (f", upgraded to {head})" if head != revision else ")")
          + (f"\nwhat it held before is in {saved}" if saved else ""))
    return 0


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
