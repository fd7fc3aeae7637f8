"""`openclaw db ...`: the store's schema (upgrade), its backup and restore, and pruning old rows.

A backup is taken with SQLite's online backup API, so it is consistent while the daemon runs. A
restore replaces the whole database (every user, conversation, reminder), so it refuses while a
daemon uses the data_dir (a running daemon keeps conversations in memory), asks first, and keeps
what the database held before beside it. A PostgreSQL store has pg_dump and pg_restore for this.
Pruning runs the daemon's own daily clean-up now (openclaw/store/retention.py); it is safe while
the daemon runs, as each batch is a short transaction of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
from datetime import datetime
from pathlib import Path

from openclaw.cli.common import confirmed, data_dir_held
from openclaw.config import load_config
from openclaw.gateway import access


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
    p = db.add_parser("prune", help="delete the rows the [store] keep_* limits no longer keep, now "
                                    "(the daemon does it daily); safe while it runs")
    p.add_argument("--dry-run", action="store_true", help="count them, delete nothing")
    p.set_defaults(func=cmd_db_prune)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from openclaw.store import upgrade

    config = load_config(args.config, tokens=False)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    upgrade(config.store.url)
    print("database is at the latest schema")
    return 0


def cmd_db_backup(args: argparse.Namespace) -> int:
    from openclaw.store.backup import backup, sqlite_path

    config = load_config(args.config, tokens=False)
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

    config = load_config(args.config, tokens=False)
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


def cmd_db_prune(args: argparse.Namespace) -> int:
    """What the daemon's daily clean-up does, at once, with the counts. Not refused while a
    daemon runs: it deletes only rows the daemon is done with, a batch per short transaction
    (on SQLite a daemon's write waits for a batch, at most milliseconds; busy_timeout covers it)."""
    from openclaw.store import Store
    from openclaw.store.backup import sqlite_path
    from openclaw.store.retention import Retention, prune, rules

    config = load_config(args.config, tokens=False)
    try:
        database = sqlite_path(config.store.url)
    except ValueError:  # PostgreSQL: it is there to ask
        database = None
    if database is not None and not database.exists():  # a fresh install: nothing to make
        print(f"nothing to prune: no database yet at {database}")
        return 0
    retention = Retention.of(config.store)
    kept = access.config_names(config)

    async def run() -> dict[str, int]:
        async with await Store.open(config.store.url) as store:
            return await prune(store, retention, kept_users=kept, dry_run=args.dry_run)

    counts = asyncio.run(run())
    print("would delete (--dry-run: nothing changed):" if args.dry_run else "deleted:")
    why = rules(retention)
    for kind, n in counts.items():
        print(f"  {kind:<23} {n:>8}  {why[kind]}")
    if not args.dry_run and database is not None and any(counts.values()):
        print(f"{database.name} keeps its size: SQLite reuses the freed pages for new rows")
    return 0


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
