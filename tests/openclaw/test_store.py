"""The store against real databases: SQLite files in tmp_path, and PostgreSQL when one can be started.

Behaviour tests run on both backends through the `store` fixture. The PostgreSQL cluster is a
throwaway one (initdb + pg_ctl, about a second); without asyncpg or the server binaries those
cases are skipped and say why.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sqlite3
import sys
import textwrap
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.exc import IntegrityError

from openclaw.store import (
    PAIRING_ALPHABET,
    ConversationStatus,
    InboundStatus,
    MessageRole,
    OutboundStatus,
    PairingLimits,
    ReminderStatus,
    Store,
    StoreUnavailableError,
    UnknownUserError,
    UserStatus,
    head_revision,
    migrations_dir,
    normalize_url,
    upgrade,
)
from openclaw.store import engine as store_engine
from openclaw.store.migrate import alembic_config
from openclaw.store.models import Base, ConversationRow, in_models
from openclaw.store.users import find_user
from tests.helpers.clock import FakeClock
from tests.helpers.store import fresh_store, left_at_revision

REPO = Path(__file__).resolve().parents[2]
TABLES = {"users", "pairing_codes", "pairing_issued", "pairing_refusals", "conversations", "messages",
          "inbound_events", "outbound_messages", "summaries", "audit_log", "usage", "reminders",
          "heartbeats", "jobs", "job_runs", "mcp_servers", "mcp_tools", "traces", "feedback",
          "prompt_versions", "prompt_settings", "prompt_pins",
          "alembic_version", "memories", "memory_off",
          # FTS5's over memories (migration 0010)
          "memories_fts", "memories_fts_data", "memories_fts_idx", "memories_fts_docsize",
          "memories_fts_config"}


# -- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with fresh_store(request, tmp_path, clock=clock) as opened:
        yield opened


async def _pragma(store: Store, name: str) -> object:
    async with store.engine.connect() as conn:
        return (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar()


# -- migrations and SQLite settings -----------------------------------------------------------------

async def test_migrations_create_everything_from_an_empty_file_and_rerun_as_a_no_op(sqlite_url: str):
    assert migrations_dir() == REPO / "migrations"
    db_file = Path(normalize_url(sqlite_url).database or "")
    assert not db_file.exists()

    store = await Store.open(sqlite_url)
    assert await store.schema_revision() == head_revision() == "0014"
    await store.close()
    store = await Store.open(sqlite_url)  # second open: nothing left to apply
    await store.close()
    await asyncio.to_thread(upgrade, sqlite_url)  # what `openclaw db upgrade` runs

    # Alembic's own view, through a plain synchronous engine that shares no code with the store.
    engine = sqlalchemy.create_engine(f"sqlite:///{db_file}")
    try:
        with engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == head_revision()
            assert conn.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() == 1
            assert set(sqlalchemy.inspect(conn).get_table_names()) == TABLES
    finally:
        engine.dispose()


async def test_upgrade_from_the_first_revision_keeps_the_data(sqlite_url: str):
    await left_at_revision(sqlite_url, "0001", (
        "INSERT INTO users (channel, external_id, status, created_at, updated_at) "
        "VALUES ('telegram', '7', 'allowed', '2025-01-01 00:00:00', '2025-01-01 00:00:00')", ()))
    async with await Store.open(sqlite_url) as store:
        assert await store.schema_revision() == head_revision()
        assert (await store.get_user("telegram", 7)).status is UserStatus.ALLOWED
        assert await store.active_reminders() == []


async def test_upgrade_numbers_existing_reminders_per_user_in_the_order_they_were_made(sqlite_url: str):
    insert = ("INSERT INTO reminders (user_key, channel, chat_id, text, due_at, timezone, "
              "local_time, status, fired_count, created_at) VALUES (?, ?, '1', 'x', "
              "'2025-01-01 08:00:00', 'UTC', '08:00:00', ?, 0, '2025-01-01 00:00:00')")
    await left_at_revision(sqlite_url, "0002", *(
        (insert, (user, user.split(":")[0], status))
        for user, status in [("telegram:1", "cancelled"), ("discord:2", "active"),
                             ("telegram:1", "done"), ("telegram:1", "active"), ("discord:2", "active")]))
    async with await Store.open(sqlite_url) as store:
        async with store.engine.connect() as conn:
            rows = (await conn.exec_driver_sql("SELECT id, user_key, number FROM reminders")).all()
        assert sorted(rows) == [(1, "telegram:1", 1), (2, "discord:2", 1), (3, "telegram:1", 2),
                                (4, "telegram:1", 3), (5, "discord:2", 2)]
        # Numbers of cancelled and done ones stay taken; the next one follows them.
        later = datetime(2025, 6, 2, tzinfo=UTC)
        assert (await store.add_reminder("telegram:1", 1, "new", later)).number == 4
        async with store.engine.begin() as conn:
            with pytest.raises(IntegrityError):  # NOT NULL now, and unique per user
                await conn.exec_driver_sql("UPDATE reminders SET number = 1 WHERE id = 3")


async def _index_names(store: Store, table: str) -> set[str]:
    async with store.engine.connect() as conn:
        return {row[1] for row in (await conn.exec_driver_sql(f"PRAGMA index_list({table})")).all()}


async def test_upgrade_to_0005_adds_the_user_and_chat_indexes_and_a_downgrade_removes_them(sqlite_url: str):
    await left_at_revision(sqlite_url, "0004", (
        "INSERT INTO inbound_events (channel, message_id, user_key, chat_id, text, status, received_at) "
        "VALUES ('telegram', '1', 'telegram:7', '7', 'hi', 'processed', '2025-01-01 00:00:00')", ()), (
        "INSERT INTO outbound_messages (inbound_event_id, channel, chat_id, text, status, attempts, "
        "created_at, updated_at) VALUES (1, 'telegram', '7', 'hello', 'pending', 0, "
        "'2025-01-01 00:00:00', '2025-01-01 00:00:00')", ()))
    new = {("inbound_events", "ix_inbound_events_user_key"),
           ("outbound_messages", "ix_outbound_messages_channel_chat_id_status_id")}
    async with await Store.open(sqlite_url) as store:
        assert await store.schema_revision() == head_revision()
        for table, index in new:
            assert index in await _index_names(store, table)
        assert [o.text for o in await store.pending_outbound("telegram", "7")] == ["hello"]
    await asyncio.to_thread(command.downgrade, alembic_config(sqlite_url), "0004")
    async with await Store.open(sqlite_url, migrate_schema=False) as store:
        assert await store.schema_revision() == "0004"
        for table, index in new:
            assert index not in await _index_names(store, table)
        assert [o.text for o in await store.pending_outbound("telegram", "7")] == ["hello"]


async def test_upgrade_to_0006_adds_the_pairing_rate_tables_and_a_downgrade_removes_them(sqlite_url: str):
    await left_at_revision(sqlite_url, "0005", (
        "INSERT INTO users (channel, external_id, status, created_at, updated_at) "
        "VALUES ('telegram', '7', 'pending', '2025-01-01 00:00:00', '2025-01-01 00:00:00')", ()))
    async with await Store.open(sqlite_url) as store:
        assert await store.schema_revision() == head_revision()
        assert await store.create_pairing_code("telegram:7", PairingLimits(per_user=1)) is not None
        async with store.engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT user_key FROM pairing_issued")).all() == \
                [("telegram:7",)]
    await asyncio.to_thread(command.downgrade, alembic_config(sqlite_url), "0005")
    async with await Store.open(sqlite_url, migrate_schema=False) as store:
        assert await store.schema_revision() == "0005"
        async with store.engine.connect() as conn:
            tables = await conn.run_sync(lambda sync: set(sqlalchemy.inspect(sync).get_table_names()))
        assert not {"pairing_issued", "pairing_refusals"} & tables
        # Read as 0005 holds it: the models are the head revision's.
        async with store.engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT count(*) FROM pairing_codes")).scalar() == 1


async def test_migrated_schema_matches_the_orm_models(store: Store):
    async with store.engine.connect() as conn:
        diff = await conn.run_sync(lambda sync: compare_metadata(
            MigrationContext.configure(sync, opts={"compare_type": True, "include_name": in_models}),
            Base.metadata))
    assert diff == []


async def test_a_store_at_its_schema_opens_while_another_process_holds_the_write_lock(
        sqlite_url: str):
    """Opening reads the schema's revision first: a migration takes SQLite's write lock, which
    every `openclaw` command opening the store would wait for, and fail on after the busy
    timeout while another process writes long (`users forget`, a backup)."""
    async with await Store.open(sqlite_url):
        pass
    other = sqlite3.connect(sqlite_url.split(":///", 1)[1], isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        async with await Store.open(sqlite_url, busy_timeout_ms=200) as store:
            assert await store.list_users() == []
    finally:
        other.close()


async def test_sqlite_file_runs_in_wal_mode_with_foreign_keys_on(sqlite_url: str):
    async with await Store.open(sqlite_url) as store:
        assert await _pragma(store, "journal_mode") == "wal"
        assert await _pragma(store, "synchronous") == 1  # NORMAL
        assert await _pragma(store, "foreign_keys") == 1
        assert await _pragma(store, "busy_timeout") == 10_000


async def test_the_wal_is_cut_back_to_its_limit_once_a_long_reader_lets_go(sqlite_url: str,
                                                                          monkeypatch):
    # A reader holding one snapshot (a `sqlite3` shell left in BEGIN, a backup) keeps every write
    # made meanwhile in the -wal file; once it lets go, a checkpoint empties the file, and the
    # store's next write starts it over, cut back to the limit rather than kept at its peak.
    limit = 256 * 1024
    monkeypatch.setattr(store_engine, "JOURNAL_SIZE_LIMIT", limit)
    db = Path(sqlite_url.removeprefix("sqlite+aiosqlite:///"))
    wal = Path(f"{db}-wal")
    async with await Store.open(sqlite_url) as store:
        await store.ensure_user("telegram", 42, "Ada", status=UserStatus.ALLOWED)
        conv = await store.active_conversation("telegram:42", "42", "telegram")
        reader = sqlite3.connect(db, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM messages").fetchone()  # its snapshot is held now
            for _ in range(100):  # about 6 MiB: past the automatic checkpoint's 1000 pages
                await store.add_message(conv.id, "user", "x" * 60_000)
            assert wal.stat().st_size > 24 * limit  # none of it could be checkpointed
        finally:
            reader.close()
        for _ in range(3):  # the first commit checkpoints everything; the next starts the file over
            await store.add_message(conv.id, "user", "hello")
        assert wal.stat().st_size <= limit


def test_store_urls_are_normalized_to_async_drivers():
    assert normalize_url("sqlite:///x.db").drivername == "sqlite+aiosqlite"
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+asyncpg"
    with pytest.raises(ValueError, match="supports"):
        normalize_url("mysql://u@h/db")


async def test_a_store_that_cannot_be_opened_says_where_and_what_to_check(tmp_path: Path):
    not_a_folder = tmp_path / "plain-file"
    not_a_folder.write_text("")
    with pytest.raises(StoreUnavailableError, match=r"plain-file.*check \[store\] url"):
        await Store.open(f"sqlite:///{not_a_folder}/openclaw.db")


# -- restarts and crash recovery --------------------------------------------------------------------

async def test_conversation_survives_a_restart(sqlite_url: str):
    async with await Store.open(sqlite_url) as store:
        user = await store.ensure_user("terminal", "local", status="allowed")
        conv = await store.active_conversation(user.key, "local")
        await store.add_message(conv.id, "user", "my name is Ada")
        await store.add_message(conv.id, "assistant", "Hello Ada!")

    async with await Store.open(sqlite_url) as store:
        again = await store.active_conversation("terminal:local", "local")
        assert again.id == conv.id
        assert [m.content for m in await store.list_messages(again.id)] == ["my name is Ada", "Hello Ada!"]


async def test_pending_inbound_lists_what_a_killed_daemon_had_not_processed(sqlite_url: str):
    # A real crash: the writer process dies by SIGKILL right after its commits, with no clean close.
    script = textwrap.dedent(f"""
        import asyncio, os, signal
        from openclaw.store import Store

        async def main():
            store = await Store.open({sqlite_url!r})
            done, _ = await store.record_inbound("telegram", 1, "telegram:7", 7, "first")
            await store.record_inbound("telegram", 2, "telegram:7", 7, "second")
            await store.record_inbound("telegram", 3, "telegram:7", 7, "third")
            await store.mark_inbound(done.id, "processed")
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
    """)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, cwd=REPO)
    assert await proc.wait() == -9

    async with await Store.open(sqlite_url) as store:
        pending = await store.pending_inbound()
        assert [(e.message_id, e.text) for e in pending] == [("2", "second"), ("3", "third")]
        await store.mark_inbound(pending[0].id, InboundStatus.FAILED, error="engine crashed")
        assert [e.text for e in await store.pending_inbound()] == ["third"]


async def test_a_moved_chats_unanswered_messages_are_recovered_under_its_new_id(store: Store):
    group, supergroup = "-4001", "-1001234567890"
    answered, _ = await store.record_inbound("telegram", "-4001:1", "telegram:7", group, "answered")
    await store.mark_inbound(answered.id, InboundStatus.PROCESSED)
    waiting, _ = await store.record_inbound("telegram", "-4001:2", "telegram:7", group, "waiting")
    elsewhere, _ = await store.record_inbound("discord", "9", "discord:7", group, "same id, other app")
    await store.move_chat("telegram", group, supergroup)
    assert [(e.id, e.chat_id) for e in await store.pending_inbound()] == [
        (waiting.id, supergroup), (elsewhere.id, group)]
    # What was answered stays where it was answered (a redelivery hands back the stored row).
    again, is_new = await store.record_inbound("telegram", "-4001:1", "telegram:7", group, "answered")
    assert not is_new and again.chat_id == group


# -- inbound dedupe ----------------------------------------------------------------------------------

async def test_redelivered_inbound_message_is_recorded_once(store: Store):
    first, is_new = await store.record_inbound("telegram", 555, "telegram:1001", 1001, "hi", {"update_id": 9})
    assert is_new and first.status is InboundStatus.RECEIVED and first.payload == {"update_id": 9}
    again, is_new = await store.record_inbound("telegram", "555", "telegram:1001", 1001, "hi")
    assert not is_new and again.id == first.id
    other, is_new = await store.record_inbound("discord", 555, "discord:1", 2, "hi")  # other channel
    assert is_new and other.id != first.id

    await store.mark_inbound(first.id, "processed")
    assert [e.id for e in await store.pending_inbound()] == [other.id]
    with pytest.raises(LookupError):
        await store.mark_inbound(10_000, "processed")


async def test_ten_concurrent_identical_deliveries_make_exactly_one_new_event(store: Store):
    results = await asyncio.gather(*[
        store.record_inbound("telegram", 42, "telegram:1001", 1001, "hello") for _ in range(10)])
    assert sum(is_new for _, is_new in results) == 1
    assert len({event.id for event, _ in results}) == 1
    assert len(await store.pending_inbound()) == 1


async def test_a_call_whose_caller_is_cancelled_twice_still_ends_whole_on_its_connection(
        store: Store, caplog: pytest.LogCaptureFixture):
    """A /stop and then a drain cancel the same turn while it writes: each call it had begun
    commits whole, no connection is torn down and replaced, and nothing is logged as an error
    (SQLAlchemy logged "Exception closing connection" and asyncio "Task was destroyed")."""
    await store.ensure_user("telegram", 1, status="allowed")
    conv = await store.active_conversation("telegram:1", 1)
    opened = []
    sqlalchemy.event.listen(store.engine.sync_engine, "connect", lambda *_: opened.append(1))
    for round_ in range(40):
        writes = [asyncio.create_task(store.add_message(conv.id, "user", f"{round_}-{i}"))
                  for i in range(3)]
        for _ in range(1 + round_ % 4):  # into the middle of the statements, a trip each
            await asyncio.sleep(0)
        for _twice in range(2):
            for write in writes:
                write.cancel()
            await asyncio.sleep(0)
        # Each caller gets its cancel once its call has ended: what it wrote is there then.
        await asyncio.gather(*writes, return_exceptions=True)
        assert all(w.cancelled() for w in writes) and not store._calls
    stored = [m.content for m in await store.list_messages(conv.id)]
    assert len(stored) == len(set(stored)) and 0 < len(stored) <= 120
    assert len(opened) <= 3  # one for each call at a time, none to replace a terminated one
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_cancelled_close_leaves_the_call_it_waits_for_to_end_and_nothing_is_logged(
        sqlite_url: str, caplog: pytest.LogCaptureFixture):
    """close() waits for calls still running; cancelled (a stop's own limit), it must not cancel
    them, and a call whose caller went away fails without "Task exception was never retrieved"."""
    store = await Store.open(sqlite_url)
    await store.ensure_user("telegram", 1, status="allowed")
    conv = await store.active_conversation("telegram:1", 1)
    abandoned = asyncio.create_task(store.add_message(10**6, "user", "no such conversation"))
    await asyncio.sleep(0)
    abandoned.cancel()
    await asyncio.gather(abandoned, return_exceptions=True)
    path = sqlite_url.split(":///", 1)[1]
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write below waits for this lock
    write = asyncio.create_task(store.add_message(conv.id, "user", "held"))
    await asyncio.sleep(0.1)
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0.1)
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    other.rollback()
    other.close()
    await write  # its caller was never cancelled: it gets its message
    await store.engine.dispose()
    gc.collect()
    async with await Store.open(sqlite_url) as again:
        assert [m.content for m in await again.list_messages(conv.id)] == ["held"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- users and conversations -------------------------------------------------------------------------

async def test_ensure_user_inserts_once_and_never_changes_status(store: Store):
    ada = await store.ensure_user("telegram", 1001, "Ada")
    assert ada.status is UserStatus.PENDING and ada.key == "telegram:1001"
    assert ada.created_at.tzinfo is not None
    same = await store.ensure_user("telegram", "1001", "Ada L.", status="allowed")
    assert same.id == ada.id and same.status is UserStatus.PENDING and same.display_name == "Ada L."

    admin = await store.set_user_status("telegram", 1001, "allowed", role="admin")
    assert (admin.status, admin.role) == (UserStatus.ALLOWED, "admin")
    blocked = await store.set_user_status("discord", 66, UserStatus.BLOCKED)  # never seen before
    assert (await store.get_user("discord", 66)) == blocked
    assert await store.get_user("discord", 67) is None
    assert [u.key for u in await store.list_users()] == ["telegram:1001", "discord:66"]
    assert [u.key for u in await store.list_users(status="blocked")] == ["discord:66"]


async def test_one_active_conversation_per_user_and_chat_then_archive_starts_fresh(store: Store):
    user = (await store.ensure_user("telegram", 1001)).key
    with pytest.raises(UnknownUserError, match="ensure_user"):
        await store.active_conversation("telegram:999", 999)

    convs = [await store.active_conversation(user, 1001) for _ in range(2)]
    assert convs[0] == convs[1] and convs[0].status is ConversationStatus.ACTIVE
    group = await store.active_conversation(user, -500)
    assert group.id != convs[0].id

    assert await store.archive_conversation(convs[0].id)
    assert not await store.archive_conversation(convs[0].id)
    archived = await store.get_conversation(convs[0].id)
    assert archived is not None and archived.status is ConversationStatus.ARCHIVED and archived.archived_at
    fresh = await store.active_conversation(user, 1001)
    assert fresh.id not in (convs[0].id, group.id)


async def test_concurrent_first_messages_share_one_new_conversation(store: Store):
    # Several rounds: once the pool is warm the ten calls truly overlap, so a lost race would show
    # up as a second conversation or an error (SQLITE_BUSY on SQLite, a unique violation on PostgreSQL).
    for round_ in range(4):
        user = (await store.ensure_user("telegram", 100 + round_)).key
        convs = await asyncio.gather(*[store.active_conversation(user, 7) for _ in range(10)])
        assert len({c.id for c in convs}) == 1


async def test_database_itself_rejects_a_second_active_conversation(store: Store):
    conv = await store.active_conversation((await store.ensure_user("telegram", 1)).key, 1)
    now = store.now()
    with pytest.raises(IntegrityError):
        async with store.transaction() as session:
            session.add(ConversationRow(user_id=conv.user_id, channel="telegram", chat_id="1",
                                        status=ConversationStatus.ACTIVE, created_at=now, updated_at=now))


# -- pairing ---------------------------------------------------------------------------------------

async def test_pairing_code_is_eight_unambiguous_characters_and_stable_per_user(store: Store):
    user = (await store.ensure_user("telegram", 1001, "Ada")).key
    code = await store.create_pairing_code(user)
    assert code is not None and len(code) == 8 and set(code) <= set(PAIRING_ALPHABET)
    assert not set("0O1I") & set(PAIRING_ALPHABET)
    assert await store.create_pairing_code(user) == code
    [listed] = await store.list_pairing_codes()
    assert (listed.code, listed.user, listed.display_name) == (code, user, "Ada")
    with pytest.raises(UnknownUserError):
        await store.create_pairing_code("telegram:404")


async def test_at_most_three_codes_wait_and_a_newcomer_replaces_the_oldest(store: Store, clock: FakeClock):
    users = [(await store.ensure_user("telegram", i)).key for i in range(5)]
    codes = [await store.create_pairing_code(u) for u in users[:3]]
    assert None not in codes and len(set(codes)) == 3
    assert await store.create_pairing_code(users[0]) == codes[0]  # a waiting user still gets theirs
    fourth = await store.create_pairing_code(users[3])
    assert fourth is not None and fourth not in codes
    assert [c.code for c in await store.list_pairing_codes()] == [*codes[1:], fourth]

    clock.advance(3601)
    fifth = await store.create_pairing_code(users[4])
    assert [c.code for c in await store.list_pairing_codes()] == [fifth]
    assert len(await store.list_pairing_codes(include_expired=True)) == 5


async def test_a_block_made_while_pairing_is_not_undone_by_the_code(store: Store):
    """`openclaw users block` may land between the gateway reading a user as pending and its
    pairing code being stored or approved: no code for them then, and no approving one."""
    waiting = (await store.ensure_user("telegram", 1001)).key
    await store.set_user_status("telegram", 1001, "blocked")  # after the read, before the code
    assert await store.create_pairing_code(waiting) is None
    other = (await store.ensure_user("telegram", 1002)).key
    code = await store.create_pairing_code(other)
    async with store.transaction() as session:  # blocked behind the code's back (no withdrawal)
        row = await find_user(session, "telegram", "1002")
        row.status = UserStatus.BLOCKED
    assert await store.approve_pairing(code) is None and await store.deny_pairing(code) is None
    assert (await store.get_user("telegram", 1002)).status is UserStatus.BLOCKED


async def test_expired_code_cannot_be_approved_and_a_new_one_is_issued(store: Store, clock: FakeClock):
    user = (await store.ensure_user("telegram", 1001)).key
    old = await store.create_pairing_code(user, PairingLimits(ttl_s=60))
    clock.advance(60)
    assert await store.approve_pairing(old) is None
    new = await store.create_pairing_code(user, PairingLimits(ttl_s=0))  # expired on arrival
    assert new != old and await store.approve_pairing(new) is None


async def test_approving_a_code_allows_its_user_once(store: Store):
    user = (await store.ensure_user("telegram", 1001)).key
    code = await store.create_pairing_code(user)
    typed = f" {code[:4].lower()}-{code[4:]} "  # as someone might type it
    approved = await store.approve_pairing(typed)
    assert approved is not None and approved.key == user and approved.status is UserStatus.ALLOWED
    [used] = await store.list_pairing_codes(include_expired=True)
    assert used.used_at is not None
    assert await store.list_pairing_codes() == []
    assert await store.approve_pairing(code) is None
    assert await store.approve_pairing("ZZZZZZZZ") is None


# -- messages, summaries, outbound, audit, usage ----------------------------------------------------

async def test_messages_come_back_in_order_with_tool_calls_intact(store: Store):
    conv = await store.active_conversation((await store.ensure_user("telegram", 1)).key, 1)
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "clock", "arguments": {"tz": "Europe/Paris", "n": [1, 2.5, None]}}}]
    added = [
        await store.add_message(conv.id, "system", "be brief"),
        await store.add_message(conv.id, MessageRole.USER, "what time is it? ⏰", token_count=9),
        await store.add_message(conv.id, "assistant", "", tool_calls=calls),
        await store.add_message(conv.id, "tool", '{"time": "12:00"}', tool_call_id="call_1"),
        await store.add_message(conv.id, "assistant", "It is noon."),
    ]
    listed = await store.list_messages(conv.id)
    assert listed == added and [m.id for m in listed] == sorted(m.id for m in listed)
    assert listed[2].tool_calls == calls and listed[1].tool_calls is None
    assert listed[3].as_chat() == {"role": "tool", "content": '{"time": "12:00"}', "tool_call_id": "call_1"}
    assert [m.content for m in await store.list_messages(conv.id, after_id=added[2].id)] == [
        '{"time": "12:00"}', "It is noon."]
    with pytest.raises(ValueError):
        await store.add_message(conv.id, "robot", "?")
    with pytest.raises(LookupError):
        await store.add_message(10_000, "user", "nobody home")


async def test_latest_summary_is_the_one_reaching_furthest(store: Store):
    conv = await store.active_conversation((await store.ensure_user("telegram", 1)).key, 1)
    assert await store.latest_summary(conv.id) is None
    await store.add_summary(conv.id, 10, "first part", 40)
    await store.add_summary(conv.id, 25, "up to 25", 60)
    latest = await store.latest_summary(conv.id)
    assert latest is not None and (latest.up_to_message_id, latest.content, latest.token_count) == (
        25, "up to 25", 60)


async def test_outbound_delivery_attempts_and_status_transitions(store: Store):
    conv = await store.active_conversation((await store.ensure_user("telegram", 1)).key, 1)
    [out] = await store.add_reply("telegram", 1, ["hello"], conversation_id=conv.id)
    assert (out.status, out.attempts, out.sent_at) == (OutboundStatus.PENDING, 0, None)
    assert [o.id for o in await store.pending_outbound()] == [out.id]

    retry = await store.mark_outbound(out.id, "pending", error="timed out")
    assert (retry.attempts, retry.error) == (1, "timed out")
    sent = await store.mark_outbound(out.id, "sent", external_message_id=777)
    assert (sent.status, sent.attempts, sent.external_message_id, sent.error) == (
        OutboundStatus.SENT, 2, "777", None)
    assert sent.sent_at is not None and await store.pending_outbound() == []
    with pytest.raises(ValueError, match="already sent"):
        await store.mark_outbound(out.id, "failed")

    [lost] = await store.add_reply("telegram", 1, ["bye"])
    failed = await store.mark_outbound(lost.id, OutboundStatus.FAILED, error="chat not found")
    assert (failed.status, failed.attempts, failed.conversation_id) == (OutboundStatus.FAILED, 1, None)
    assert await store.pending_outbound() == []
    with pytest.raises(LookupError):
        await store.mark_outbound(10_000, "sent")


async def test_one_chats_pending_replies_come_in_the_order_stored_and_no_other_chats(store: Store):
    first = await store.add_reply("telegram", 7, ["one", "two"])
    await store.add_reply("telegram", 8, ["another chat"])
    await store.add_reply("discord", 7, ["the same id on another app"])
    [sent] = await store.add_reply("telegram", 7, ["sent already"])
    await store.mark_outbound(sent.id, "sent", external_message_id=1)
    [failed] = await store.add_reply("telegram", 7, ["given up"])
    await store.mark_outbound(failed.id, "failed", error="chat not found")
    later = await store.add_reply("telegram", "7", ["three"])
    assert [(o.id, o.text) for o in await store.pending_outbound("telegram", "7")] == [
        (o.id, o.text) for o in first + later]
    assert [o.text for o in await store.pending_outbound("telegram", "7", limit=1)] == ["one"]
    assert [o.text for o in await store.pending_outbound("discord", "7")] == ["the same id on another app"]
    assert await store.pending_outbound("telegram", "9") == []


async def test_audit_log_lists_newest_first(store: Store):
    await store.add_audit("telegram:1", "shell", {"cmd": "ls"}, "allowed", exit_status=0, duration_ms=12,
                          output_bytes=300)
    await store.add_audit("telegram:2", "email", {"to": ["a@b.c"]}, "denied", detail="recipient not allowed")
    newest, oldest = await store.list_audit()
    assert (newest.skill, newest.decision, newest.detail) == ("email", "denied", "recipient not allowed")
    assert (oldest.arguments, oldest.exit_status, oldest.output_bytes) == ({"cmd": "ls"}, 0, 300)
    assert [e.skill for e in await store.list_audit(user="telegram:1")] == ["shell"]
    assert len(await store.list_audit(limit=1)) == 1


async def test_tokens_today_counts_this_utc_day_per_user_and_overall(store: Store, clock: FakeClock):
    clock.now = datetime(2025, 6, 1, 23, 30, tzinfo=UTC)
    await store.add_usage("telegram:1", 100, 20)  # yesterday, once the clock passes midnight
    clock.advance(3600)
    await store.add_usage("telegram:1", 50, 5)
    await store.add_usage("discord:2", 7, 3)
    assert await store.tokens_today("telegram:1") == 55
    assert await store.tokens_today() == 65
    assert await store.tokens_today("terminal:local") == 0
    assert await store.tokens_today("telegram:1", since=datetime(2025, 6, 1, tzinfo=UTC)) == 175


async def test_reminders_are_kept_per_user_soonest_first_within_a_limit(store: Store, clock: FakeClock):
    soon, later = clock.now + timedelta(minutes=5), clock.now + timedelta(days=1)
    b = await store.add_reminder("telegram:1", 1, "later", later, repeat="daily", timezone="Europe/Paris")
    a = await store.add_reminder("telegram:1", 1, "soon", soon)
    other = await store.add_reminder("discord:2", "c9", "theirs", soon, max_active=1)
    assert (b.channel, b.chat_id, b.repeat, b.timezone, b.status, b.fired_count) == (
        "telegram", "1", "daily", "Europe/Paris", ReminderStatus.ACTIVE, 0)
    assert (other.channel, other.chat_id, other.due_at) == ("discord", "c9", soon)
    assert [r.text for r in await store.active_reminders("telegram:1")] == ["soon", "later"]
    assert [r.id for r in await store.active_reminders(due_by=soon)] == [a.id, other.id]
    assert [r.id for r in await store.active_reminders(due_by=soon, exclude={a.id})] == [other.id]
    assert [r.id for r in await store.active_reminders(limit=1)] == [a.id]
    assert await store.add_reminder("discord:2", "c9", "one too many", soon, max_active=1) is None
    assert len(await store.active_reminders("discord:2")) == 1

    assert await store.cancel_reminder("discord:2", a.number) is None  # not theirs
    cancelled = await store.cancel_reminder("telegram:1", a.number)
    assert (cancelled.id, cancelled.status) == (a.id, ReminderStatus.CANCELLED)
    assert await store.cancel_reminder("telegram:1", a.number) is None  # no longer active
    assert [r.id for r in await store.active_reminders("telegram:1")] == [b.id]


async def test_firing_a_reminder_records_it_and_queues_its_message_once(store: Store, clock: FakeClock):
    user = await store.ensure_user("telegram", 1, status="allowed")
    conv = await store.active_conversation(user.key, 1)
    once = await store.add_reminder(user.key, 1, "call", clock.now)
    daily = await store.add_reminder(user.key, 1, "pills", clock.now, repeat="daily", timezone="UTC")
    clock.advance(30)

    [out] = await store.fire_reminder(once.id, once.due_at, None, ["⏰ call"], conversation_id=conv.id)
    assert (out.channel, out.chat_id, out.text, out.status, out.conversation_id) == (
        "telegram", "1", "⏰ call", OutboundStatus.PENDING, conv.id)
    assert await store.fire_reminder(once.id, once.due_at, None, ["again"]) is None  # done already
    tomorrow = daily.due_at + timedelta(days=1)
    assert len(await store.fire_reminder(daily.id, daily.due_at, tomorrow, ["a", "b"])) == 2
    # A second delivery of the same due time (two firings racing) records nothing.
    assert await store.fire_reminder(daily.id, daily.due_at, tomorrow, ["dup"]) is None
    [left] = await store.active_reminders()
    assert (left.id, left.due_at, left.fired_count, left.fired_at) == (daily.id, tomorrow, 1, clock.now)
    assert [o.text for o in await store.pending_outbound()] == ["⏰ call", "a", "b"]

    await store.cancel_reminder(user.key, daily.number)
    assert await store.fire_reminder(daily.id, tomorrow, None, ["x"]) is None
    assert len(await store.pending_outbound()) == 3


async def test_a_chat_that_refuses_the_bot_loses_only_its_own_active_reminders(
        store: Store, clock: FakeClock):
    first = await store.add_reminder("telegram:1", 1, "pills", clock.now, repeat="daily")
    second = await store.add_reminder("telegram:2", 1, "in the same chat, by another", clock.now)
    done = await store.add_reminder("telegram:1", 1, "done already", clock.now)
    await store.fire_reminder(done.id, done.due_at, None, ["x"])
    group = await store.add_reminder("telegram:1", -5, "in a group", clock.now)
    same_id = await store.add_reminder("discord:1", 1, "same chat id, other service", clock.now)

    cancelled = await store.cancel_chat_reminders("telegram", "1")
    assert [r.id for r in cancelled] == [first.id, second.id]
    assert all(r.status is ReminderStatus.CANCELLED for r in cancelled)
    assert {r.id for r in await store.active_reminders()} == {group.id, same_id.id}
    assert await store.cancel_chat_reminders("telegram", 1) == []


async def test_the_reminder_limit_holds_for_concurrent_adds(store: Store, clock: FakeClock):
    added = await asyncio.gather(*(store.add_reminder("telegram:1", 1, f"r{n}", clock.now,
                                                      max_active=3) for n in range(10)))
    assert sum(r is not None for r in added) == 3
    assert len(await store.active_reminders("telegram:1")) == 3
    # The refused adds were rolled back with the number they took.
    assert sorted(r.number for r in added if r is not None) == [1, 2, 3]


async def test_each_user_numbers_their_reminders_from_one(store: Store, clock: FakeClock):
    ada = [await store.add_reminder("telegram:1", 1, f"ada {n}", clock.now) for n in range(2)]
    bob = await store.add_reminder("discord:2", 2, "bob", clock.now)
    assert [r.number for r in ada] == [1, 2] and bob.number == 1
    assert len({r.id for r in (*ada, bob)}) == 3

    # Bob's #1 is Bob's: Ada's #1 stays, and Bob has no #2 to cancel.
    assert await store.cancel_reminder("discord:2", 2) is None
    cancelled = await store.cancel_reminder("discord:2", 1)
    assert (cancelled.id, cancelled.text) == (bob.id, "bob")
    assert [r.number for r in await store.active_reminders("telegram:1")] == [1, 2]


async def test_numbers_are_never_given_twice_after_cancel_or_delivery(store: Store, clock: FakeClock):
    first = await store.add_reminder("telegram:1", 1, "done", clock.now)
    second = await store.add_reminder("telegram:1", 1, "cancelled", clock.now)
    await store.fire_reminder(first.id, first.due_at, None, ["x"])
    await store.cancel_reminder("telegram:1", second.number)
    assert await store.active_reminders("telegram:1") == []
    third = await store.add_reminder("telegram:1", 1, "new", clock.now)
    assert third.number == 3
    assert await store.cancel_reminder("telegram:1", 2) is None  # the cancelled #2 stays cancelled


async def test_concurrent_adds_of_one_user_get_distinct_numbers(store: Store, clock: FakeClock):
    added = await asyncio.gather(*(store.add_reminder(user, 1, f"r{n}", clock.now)
                                   for n in range(12) for user in ("telegram:1", "telegram:2")))
    for user in ("telegram:1", "telegram:2"):
        numbers = [r.number for r in added if r.user == user]
        assert sorted(numbers) == list(range(1, 13)), numbers


# A command's binary output, a name or message pasted from a file: PostgreSQL's text and jsonb
# refuse U+0000, which SQLite keeps; no UTF-8 encoder takes a lone surrogate (json.loads makes one
# of "\ud800", decoding with errors="surrogateescape" of a bad byte). Both store U+FFFD instead.
NUL_TEXT = "before\x00after"


@pytest.mark.parametrize("bad", ["\x00", "\ud800", "\udcff"])
async def test_text_with_characters_no_backend_stores_is_stored_on_every_backend(
        store: Store, bad: str) -> None:
    said = f"before{bad}after"
    await store.ensure_user("telegram", "1", f"A{bad}da")
    conv = await store.active_conversation("telegram:1", "1", "telegram")
    event, _ = await store.record_inbound("telegram", "m1", "telegram:1", "1", said,
                                          payload={"display_name": f"A{bad}da"})
    await store.add_message(conv.id, "user", said, token_count=3)
    await store.add_message(conv.id, "tool", said, tool_call_id="c1",
                            tool_calls=[{"function": {"arguments": said}}])
    await store.add_reply("telegram", "1", [said], conversation_id=conv.id, answers=event.id)
    await store.add_audit("telegram:1", "shell", {"command": said, said: 1}, "allowed", detail=said)
    texts = [m.content for m in await store.list_messages(conv.id)]
    assert texts == ["before\ufffdafter"] * 2  # the same on both
    assert (await store.get_user("telegram", "1")).display_name == "A\ufffdda"
    again, _ = await store.record_inbound("telegram", "m1", "telegram:1", "1", said)
    assert again.payload == {"display_name": "A\ufffdda"} and again.text == "before\ufffdafter"
    audit = (await store.list_audit())[0]
    assert audit.arguments == {"command": "before\ufffdafter", "before\ufffdafter": 1}


async def test_a_display_name_with_nul_is_not_rewritten_at_every_message(store: Store,
                                                                          clock: FakeClock) -> None:
    """The name is compared as stored (U+FFFD): unchanged, the row is not rewritten at every
    message of such a user."""
    first = await store.ensure_user("telegram", "1", "A\x00da")
    clock.advance(3600)
    await store.ensure_user("telegram", "1", "A\x00da")  # the same name, the next message
    again = await store.get_user("telegram", "1")
    assert again.updated_at == first.updated_at


async def test_an_audit_row_of_a_made_up_tool_name_with_nul_is_stored(store: Store) -> None:
    """The skill column holds the name the model gave, made up ones too (an unknown tool is
    audited): free text like the rest, and cut to the column's width."""
    await store.add_audit("telegram:1", "she\x00ll", {"command": "ls"}, "unknown",
                          detail="error: there is no tool named 'she\\x00ll'")
    await store.add_audit("telegram:1", "x" * 500, None, "unknown")
    made_up, with_nul = await store.list_audit()
    assert with_nul.skill == "she\ufffdll" and made_up.skill == "x" * 128
