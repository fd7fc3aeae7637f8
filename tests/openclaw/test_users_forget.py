"""`Store.forget_user` and `openclaw users forget`: one user's rows go, everyone else's stay."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from openclaw.cli import main
from openclaw.datadir import claim_data_dir
from openclaw.scheduler.heartbeat import HeartbeatSettings, HeartbeatStore
from openclaw.store import PairingLimits, Store, UserStatus
from tests.helpers.store import fresh_store

ADA, BOB = "telegram:1001", "telegram:1002"
GROUP = "-500"  # a group chat both talk in
# Each kind forget_user counts, and the table it counts in.
KINDS = {"messages": "messages", "summaries": "summaries", "outbound messages": "outbound_messages",
         "inbound messages": "inbound_events", "reminders": "reminders", "heartbeats": "heartbeats",
         "job runs": "job_runs", "jobs": "jobs", "usage rows": "usage",
         "pairing codes": "pairing_codes", "pairing codes counted": "pairing_issued",
         "pairing refusals": "pairing_refusals", "conversations": "conversations", "users": "users",
         "memory entries": "memories", "memory settings": "memory_off", "traces": "traces",
         "feedback": "feedback", "prompt pins": "prompt_pins", "audit rows blanked": "audit_log"}
# A table keyed by its columns, not an id: its key, as an id to compare rows by.
KEYS = {"prompt_pins": "user_key || '/' || name"}


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request, tmp_path):
    async with fresh_store(request, tmp_path) as opened:
        yield opened


async def snapshot(store: Store) -> dict[str, list[dict]]:
    async with store.engine.connect() as conn:
        return {table: [dict(row._mapping) for row in await conn.execute(
            text(f"SELECT {KEYS[table] + ' AS id, ' if table in KEYS else ''}* FROM {table} "
                 "ORDER BY id"))]
            for table in KINDS.values()}


async def chat(store: Store, user: str, chat_id: str, message_id: str, words: str):
    """One answered message, as the gateway stores it."""
    event, _ = await store.record_inbound("telegram", message_id, user, chat_id, words)
    conv = await store.active_conversation(user, chat_id)
    first = await store.add_message(conv.id, "user", words)
    reply = await store.add_message(conv.id, "assistant", f"about {words}")
    await store.add_trace(user=user, conversation_id=conv.id, status="answered",
                          started_at=datetime.now(UTC), inbound_event_id=event.id,
                          first_message_id=first.id, last_message_id=reply.id)
    await store.add_reply("telegram", chat_id, [f"about {words}", "(2/2)"], conversation_id=conv.id,
                          answers=event.id)
    await store.add_usage(user, 10, 5, conversation_id=conv.id)
    return conv, first


async def heartbeat(store: Store, user: str, chat_id: str, checklist: str) -> None:
    await HeartbeatStore(store).put(HeartbeatSettings(user, True, 30, "telegram", chat_id, None,
                                                      None, "UTC", checklist))


async def scheduled(store: Store, user: str, chat_id: str, prompt: str) -> None:
    """An agent job of theirs, which has run once."""
    job = await store.add_job(user, chat_id, "agent", "cron 0 8 * * *", prompt, timezone="UTC")
    await store.start_job_run(job.id, datetime.now(UTC))


async def bob_talks(store: Store, n: int) -> None:
    await store.set_user_status("telegram", "1002", UserStatus.ALLOWED)
    conv, first = await chat(store, BOB, "1002", f"b{n}", f"bob's news {n}")
    await store.add_summary(conv.id, first.id, "bob's summary", 3)
    await chat(store, BOB, GROUP, f"bg{n}", f"bob to the group {n}")
    await store.add_reply("telegram", GROUP, [f"a notice to the group {n}"])  # nobody's reply
    await store.add_reminder(BOB, GROUP, f"bob's meeting {n}", datetime.now(UTC) + timedelta(days=1))
    await heartbeat(store, BOB, "1002", f"- bob's checklist {n}")
    await scheduled(store, BOB, "1002", f"bob's build {n}")
    await store.add_audit(BOB, "shell", {"command": f"ls {n}"}, "allowed", exit_status=0)
    await store.add_memory(BOB, "private", f"bob's memory {n}")
    await grade(store, BOB, f"b{n}", "1002", "good")  # his own grade of his reply stays
    await pinned(store, BOB)


async def grade(store: Store, user: str, message_id: str, chat_id: str, kind: str,
                grader: str | None = None) -> None:
    """`grader` (else `user`) grades the reply to `user`'s message `message_id`."""
    event, _ = await store.record_inbound("telegram", message_id, user, chat_id, "")  # it, again
    await store.grade(grader or user, event.id, kind, "command")


async def pinned(store: Store, user: str) -> None:
    """`user` given a version of the system prompt (the same text again stores nothing new)."""
    await store.add_prompt_versions([("system", "v1", "One.")], "admin")
    await store.pin_prompt(user, "system", "v1")


async def ada_talks(store: Store) -> None:
    await store.ensure_user("telegram", "1001", "Ada")  # unknown: she gets a pairing code
    assert await store.create_pairing_code(ADA, PairingLimits(per_user=0)) is None  # refused first
    code = await store.create_pairing_code(ADA)
    await store.add_reply("telegram", "1001", [f"Your pairing code is {code}"])
    await store.approve_pairing(code)
    conv, _ = await chat(store, ADA, "1001", "a1", "my diary")
    await store.archive_conversation(conv.id)  # /new
    conv, first = await chat(store, ADA, "1001", "a2", "my doctor")
    await store.add_summary(conv.id, first.id, "ada's summary", 3)
    await chat(store, ADA, GROUP, "ag", "ada to the group")
    due = datetime.now(UTC) + timedelta(days=1)
    await store.add_reminder(ADA, "1001", "pills", due)
    await store.add_reminder(ADA, GROUP, "ada's meeting", due)
    await heartbeat(store, ADA, "1001", "- my doctor's results")
    await scheduled(store, ADA, "1001", "read my inbox")
    await store.add_audit(ADA, "shell", {"command": "cat diary.txt"}, "allowed", exit_status=0)
    await store.add_audit(ADA, "email", {"to": "dr@example.org", "body": "my results"}, "rejected",
                          detail="error: the user denied this email call")
    await store.add_memory(ADA, "private", "my diary is in the blue drawer")
    await store.add_memory(ADA, "group:-500", "ada's group plan")
    await store.set_memory_enabled(ADA, False)
    await grade(store, ADA, "a2", "1001", "bad")
    await pinned(store, ADA)
    await grade(store, ADA, "ag", GROUP, "good", grader=BOB)  # of her reply: it goes with it
    await grade(store, BOB, "bg1", GROUP, "bad", grader=ADA)  # hers, of his reply: goes too


async def populate(store: Store) -> tuple[dict[str, list[dict]], dict[str, set[int]]]:
    """Bob talks, then Ada, then Bob again: every row, and the ids of Ada's rows by table."""
    await bob_talks(store, 1)
    before_ada = await snapshot(store)
    await ada_talks(store)
    with_ada = await snapshot(store)
    await bob_talks(store, 2)  # her rows are not simply the newest ones
    ids = {t: {r["id"] for r in rows} - {r["id"] for r in before_ada[t]} for t, rows in with_ada.items()}
    return await snapshot(store), ids


async def test_forget_deletes_one_users_rows_and_nothing_of_anyone_elses(store):
    before, adas = await populate(store)
    bob_conv = await store.active_conversation(BOB, "1002")
    expected = {kind: len(adas[table]) for kind, table in KINDS.items()}
    assert all(expected.values()), expected  # every kind is exercised

    assert await store.forget_user(ADA, dry_run=True) == expected
    assert await snapshot(store) == before  # a dry run changes nothing
    assert await store.forget_user(ADA) == expected
    after = await snapshot(store)
    for table in set(KINDS.values()) - {"audit_log"}:
        assert after[table] == [r for r in before[table] if r["id"] not in adas[table]], table
    # Her audit rows stay, blanked; Bob's are as they were.
    blanked = {"arguments": None, "detail": Store.FORGOTTEN_AUDIT_DETAIL}
    assert after["audit_log"] == [{**r, **blanked} if r["id"] in adas["audit_log"] else r
                                  for r in before["audit_log"]]
    assert {r["user_key"] for r in after["audit_log"] if r["id"] in adas["audit_log"]} == {ADA}

    assert not any((await store.forget_user(ADA)).values())  # nothing left to forget
    # She is unknown: her next message makes a pending user with a fresh pairing code.
    assert await store.get_user("telegram", "1001") is None
    assert (await store.ensure_user("telegram", "1001")).status is UserStatus.PENDING
    assert await store.create_pairing_code(ADA) is not None
    # Bob goes on in the same conversation, with his history.
    assert (await store.active_conversation(BOB, "1002")).id == bob_conv.id
    assert await store.list_messages(bob_conv.id)


async def test_sqlite_gives_a_forgotten_conversations_id_to_the_next_one(tmp_path):
    """Why `users forget` wants the daemon stopped: a running one keeps a conversation's id (its
    lane) and history (the prompt cache) in memory, and the next new conversation, anyone's, gets
    the id back. Blocking the user first would not help: the cache is by id."""
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}") as store:
        await bob_talks(store, 1)
        await ada_talks(store)
        ada = await store.get_user("telegram", "1001")
        adas = {c["id"] for c in (await snapshot(store))["conversations"] if c["user_id"] == ada.id}
        await store.forget_user(ADA)
        carol = await store.ensure_user("telegram", 1003, status=UserStatus.ALLOWED)
        assert (await store.active_conversation(carol.key, 1003)).id in adas


def test_users_forget_asks_refuses_what_it_must_and_deletes_the_workspace_when_told(
        tmp_path, capsys, monkeypatch):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[access]\nadmins = ["telegram:1"]\n'
                      'allow = ["telegram:2"]\n')
    url = f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db"

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main(["--config", str(config), "users", "forget", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    async def fill() -> None:
        async with await Store.open(url) as store:
            await bob_talks(store, 1)
            await ada_talks(store)

    async def users() -> list[str]:
        async with await Store.open(url) as store:
            return [u.key for u in await store.list_users()]

    code, _, err = cli(ADA, "--yes")  # a fresh install: nothing to forget, nothing made
    assert code == 1 and "no database yet" in err and not (tmp_path / "data").exists()
    asyncio.run(fill())
    workspaces = {u: tmp_path / "data/workspaces" / u.replace(":", "-") for u in (ADA, BOB)}
    for folder in workspaces.values():
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_text("mine")

    # The config lets them straight back in: it says where to change that instead.
    for user, where in (("telegram:1", "access.admins"), ("telegram:2", "access.allow"),
                        ("terminal:local", "console")):
        code, _, err = cli(user, "--yes")
        assert code == 1 and where in err and len(err.splitlines()) == 1, err
    # Without --yes and no terminal to ask at: what it would delete, and nothing done.
    code, out, err = cli(ADA)
    assert code == 1 and "--yes" in err
    assert "  messages                 6\n" in out and "  conversations            3\n" in out, out
    assert f"workspace {workspaces[ADA]}: kept (add --workspace to delete it)" in out
    # A daemon holds the data_dir: it must be stopped first.
    lock = claim_data_dir(tmp_path / "data")
    try:
        code, _, err = cli(ADA, "--yes")
    finally:
        lock.close()
    assert code == 1 and "stop it" in err and len(err.splitlines()) == 1, err
    # At a terminal, "n" is no.
    monkeypatch.setattr("sys.stdin", _Terminal("n\n"))
    assert cli(ADA)[0] == 1
    assert asyncio.run(users()) == [BOB, ADA]

    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
    code, out, err = cli(ADA, "--workspace")
    assert code == 0, err
    assert "forgot telegram:1001: messages 6, summaries 1," in out
    assert f"deleted the workspace {workspaces[ADA]}" in out
    assert asyncio.run(users()) == [BOB]
    assert not workspaces[ADA].exists() and (workspaces[BOB] / "notes.txt").read_text() == "mine"
    code, _, err = cli(ADA, "--yes")
    assert code == 1 and "holds nothing about telegram:1001" in err


class _Terminal(io.StringIO):
    """Answers typed at a terminal."""

    def isatty(self) -> bool:
        return True


def test_forget_checks_the_user_key(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n')
    assert main(["--config", str(config), "users", "forget", "telegram:@ada", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "numeric id" in err and len(err.splitlines()) == 1
    assert not Path(tmp_path / "data/openclaw.db").exists()


async def test_a_forgotten_users_words_are_gone_from_the_database_files(tmp_path):
    """Deleted rows leave their bytes in free pages (SQLite builds without secure_delete) and in
    the write-ahead log until it is reset: forget zeroes the one and empties the other."""
    database = tmp_path / "openclaw.db"
    async with await Store.open(f"sqlite+aiosqlite:///{database}") as store:
        async with store.transaction() as session:  # as a build whose default is off
            await session.execute(text("PRAGMA secure_delete = OFF"))
        await bob_talks(store, 1)
        await ada_talks(store)
        files = [database, database.with_name("openclaw.db-wal")]
        assert any(b"my diary" in f.read_bytes() for f in files if f.exists())
        await store.forget_user(ADA)
        assert not any(b"my diary" in f.read_bytes() for f in files if f.exists())
        # Her memory too, from its rows and from the full-text index's segments.
        assert not any(b"blue drawer" in f.read_bytes() for f in files if f.exists())
        assert any(b"bob's news 1" in f.read_bytes() for f in files if f.exists())
