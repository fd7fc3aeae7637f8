"""`openclaw db backup` and `db restore` against real SQLite files, with a writer at work."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from openclaw.cli import main
from openclaw.datadir import claim_data_dir
from openclaw.store import Store, UserStatus, head_revision
from openclaw.store.backup import NotRestorable, backup, revision_of


def config_file(tmp_path: Path, store_url: str | None = None) -> Path:
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n'
                      + (f'[store]\nurl = "{store_url}"\n' if store_url else ""))
    return config


def database(tmp_path: Path) -> Path:
    return tmp_path / "data/openclaw.db"


def cli(config: Path, *argv: str) -> int:
    return main(["--config", str(config), *argv])


async def users_in(path: Path) -> list[str]:
    async with await Store.open(f"sqlite+aiosqlite:///{path}") as store:
        return [u.key for u in await store.list_users()]


async def add_user(tmp_path: Path, external_id: str) -> None:
    async with await Store.open(f"sqlite+aiosqlite:///{database(tmp_path)}") as store:
        await store.set_user_status("telegram", external_id, UserStatus.ALLOWED)


async def test_a_backup_taken_while_the_daemon_writes_is_one_consistent_snapshot(tmp_path):
    db, copy = tmp_path / "openclaw.db", tmp_path / "backup.db"
    store = await Store.open(f"sqlite+aiosqlite:///{db}")
    try:
        user = await store.ensure_user("telegram", 1001, status=UserStatus.ALLOWED)
        conv = await store.active_conversation(user.key, 1001)
        # Enough pages that the copy takes a while, and most recent commits sit in the -wal file
        # (a plain copy of openclaw.db alone would miss them).
        for i in range(300):
            await store.add_message(conv.id, "user", f"before {i} " + "x" * 4000)
        stop = asyncio.Event()

        async def writer() -> None:
            i = 0
            while not stop.is_set():
                await store.add_message(conv.id, "assistant", f"during {i}")
                i += 1

        writing = asyncio.create_task(writer())
        await asyncio.sleep(0.05)  # it is writing
        before = len(await store.list_messages(conv.id))
        size = await asyncio.to_thread(backup, db, copy)
        await asyncio.sleep(0.05)  # and goes on after
        stop.set()
        await writing
        after = await store.list_messages(conv.id)
    finally:
        await store.close()

    assert size == copy.stat().st_size and copy.stat().st_mode & 0o777 == 0o600
    assert not Path(f"{copy}-wal").exists()  # one self-contained file
    with sqlite3.connect(copy) as snapshot:
        assert snapshot.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert snapshot.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        ids = [i for (i,) in snapshot.execute("SELECT id FROM messages ORDER BY id")]
    # Everything committed before it began, nothing torn: the messages of one moment, 1..n with no
    # gap (each was its own commit); and not those written after it.
    assert len(ids) >= before and ids == list(range(1, len(ids) + 1))
    assert len(after) > len(ids)
    async with await Store.open(f"sqlite+aiosqlite:///{copy}") as restored:
        assert await restored.schema_revision() == head_revision()
        assert [m.content for m in await restored.list_messages(conv.id)] == [
            m.content for m in after[:len(ids)]]


def test_backup_never_overwrites_unless_forced_and_the_copy_is_the_owners_alone(tmp_path, capsys):
    config = config_file(tmp_path)
    assert cli(config, "db", "upgrade") == 0  # still there after its move to openclaw/cli/db.py
    assert "latest schema" in capsys.readouterr().out
    dest = tmp_path / "b.db"
    dest.write_text("precious")
    dest.chmod(0o644)
    assert cli(config, "db", "backup", str(dest)) == 1
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err and len(err.splitlines()) == 1
    assert dest.read_text() == "precious"
    assert cli(config, "db", "backup", str(dest), "--force") == 0
    out = capsys.readouterr().out
    assert str(dest) in out and "KiB" in out and f"openclaw db restore {dest}" in out
    assert dest.stat().st_mode & 0o777 == 0o600 and revision_of(dest) == head_revision()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    live = database(tmp_path)
    for where, why in ((tmp_path / "nowhere/b.db", "no folder"), (tmp_path, "is a folder"),
                       (live, "the database itself"), (Path(f"{live}-wal"), "the database itself")):
        assert cli(config, "db", "backup", str(where)) == 1  # the live one: not "add --force"
        err = capsys.readouterr().err
        assert why in err and len(err.splitlines()) == 1, err


def test_backup_and_restore_refuse_a_postgresql_store_saying_to_use_pg_dump(tmp_path, capsys):
    config = config_file(tmp_path, "postgresql+asyncpg://openclaw:s3cret@db.example/openclaw")
    for command in ("backup", "restore"):
        assert cli(config, "db", command, str(tmp_path / "b.db")) == 1
        err = capsys.readouterr().err
        assert "pg_dump" in err and len(err.splitlines()) == 1 and "s3cret" not in err
    assert not (tmp_path / "b.db").exists()


def test_restore_round_trip_keeps_what_it_replaced(tmp_path, capsys):
    config = config_file(tmp_path)
    asyncio.run(add_user(tmp_path, "1001"))
    dest = tmp_path / "b.db"
    assert cli(config, "db", "backup", str(dest)) == 0
    asyncio.run(add_user(tmp_path, "1002"))  # after the backup

    assert cli(config, "db", "restore", str(dest)) == 1  # stdin is not a terminal: asks for --yes
    assert "--yes" in capsys.readouterr().err
    assert asyncio.run(users_in(database(tmp_path))) == ["telegram:1001", "telegram:1002"]

    assert cli(config, "db", "restore", str(dest), "--yes") == 0
    out = capsys.readouterr().out
    assert asyncio.run(users_in(database(tmp_path))) == ["telegram:1001"]
    [saved] = (tmp_path / "data").glob("openclaw.db.before-restore-*")
    assert str(saved) in out and saved.stat().st_mode & 0o777 == 0o600
    assert asyncio.run(users_in(saved)) == ["telegram:1001", "telegram:1002"]
    assert database(tmp_path).stat().st_mode & 0o777 == 0o600


def test_restore_refuses_while_a_daemon_holds_the_data_dir(tmp_path, capsys):
    config = config_file(tmp_path)
    asyncio.run(add_user(tmp_path, "1001"))
    dest = tmp_path / "b.db"
    assert cli(config, "db", "backup", str(dest)) == 0
    asyncio.run(add_user(tmp_path, "1002"))
    lock = claim_data_dir(tmp_path / "data")  # what a running daemon holds
    try:
        assert cli(config, "db", "restore", str(dest), "--yes") == 1
    finally:
        lock.close()
    err = capsys.readouterr().err
    assert "daemon" in err and "stop it" in err and len(err.splitlines()) == 1
    assert asyncio.run(users_in(database(tmp_path))) == ["telegram:1001", "telegram:1002"]


def test_restore_refuses_what_is_not_an_openclaw_database_it_knows(tmp_path, capsys):
    config = config_file(tmp_path)
    asyncio.run(add_user(tmp_path, "1001"))
    text, other, future = tmp_path / "notes.txt", tmp_path / "other.db", tmp_path / "future.db"
    text.write_text("not a database")
    cut = tmp_path / "cut.db"  # a copy cut off on its way: the header, not its pages
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    assert cli(config, "db", "backup", str(future)) == 0
    with sqlite3.connect(future) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999_from_a_newer_openclaw'")
    cut.write_bytes(database(tmp_path).read_bytes()[:5000])
    capsys.readouterr()
    for path, why in ((text, "not an SQLite database"), (other, "not an OpenClaw database"),
                      (future, "upgrade openclaw first"), (tmp_path / "missing.db", "cannot read"),
                      (database(tmp_path), "the database itself"), (cut, "is damaged")):
        assert cli(config, "db", "restore", str(path), "--yes") == 1
        err = capsys.readouterr().err
        assert why in err and len(err.splitlines()) == 1, err
    with pytest.raises(NotRestorable):
        revision_of(other)
    assert asyncio.run(users_in(database(tmp_path))) == ["telegram:1001"]
    assert list((tmp_path / "data").glob("*.before-restore-*")) == []  # nothing was started


def test_a_postgresql_store_is_asked_not_taken_for_a_file_not_made_yet(tmp_path, capsys,
                                                                        monkeypatch):
    """A server's store has no file here: `doctor` connects to it (and says when it cannot),
    rather than reporting its database name as a file "created at first start"."""
    monkeypatch.chdir(tmp_path)  # where no file is named like the database
    config = config_file(tmp_path, "postgresql+asyncpg://openclaw:s3cret@127.0.0.1:9/openclaw")
    assert cli(config, "doctor", "--skip-model") == 1
    out = capsys.readouterr().out
    database = [line for line in out.splitlines() if "database" in line]
    assert database and "will be created" not in out and "s3cret" not in out, out
