"""Retention (openclaw/store/retention.py): what is done and old goes, what is still owed or
remembered stays; the daemon's daily task, and `openclaw db prune`. Rows are aged by setting their
timestamps, on a real SQLite file and on PostgreSQL where one can be started."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import func, select, text, update

from openclaw.cli import main
from openclaw.config import load_config
from openclaw.reload import merge
from openclaw.store import OutboundStatus, PairingLimits, Store, UserStatus
from openclaw.store.models import (
    AuditRow,
    ConversationRow,
    InboundEventRow,
    MessageRow,
    OutboundMessageRow,
    PairingCodeRow,
    SummaryRow,
    UsageRow,
    UserRow,
)
from openclaw.store.retention import KINDS, Retention, RetentionTask, prune
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.daemon import config as daemon_config
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.store import fresh_store, left_at_revision
from tests.helpers.waiting import until

ADA, BOB = "telegram:1001", "telegram:1002"
NOTHING = dict.fromkeys(KINDS, 0)
FOREVER = Retention(0, 0, 0, 0, 0)


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request, tmp_path):
    async with fresh_store(request, tmp_path) as opened:
        yield opened


def days_ago(days: float) -> datetime:
    return datetime.now(UTC) - timedelta(days=days)


async def age(store: Store, table, ids, days: float, *columns: str) -> None:
    """Make rows `days` old: each named timestamp column set to then."""
    when = days_ago(days)
    async with store.engine.begin() as conn:
        await conn.execute(update(table).where(table.id.in_(list(ids)))
                           .values(dict.fromkeys(columns, when)))


async def ids(store: Store, table) -> set[int]:
    async with store.engine.connect() as conn:
        return set(await conn.scalars(select(table.id)))


async def answered(store: Store, user: str, message_id: str, words: str) -> tuple[int, list[int]]:
    """A message answered and its reply sent, as the gateway and outbox store them: the inbound
    event's id and the reply's."""
    chat = user.split(":")[1]
    event, _ = await store.record_inbound("telegram", message_id, user, chat, words)
    conv = await store.active_conversation(user, chat)
    await store.add_message(conv.id, "user", words)
    await store.add_message(conv.id, "assistant", f"about {words}")
    pieces = await store.add_reply("telegram", chat, [f"about {words}"], conversation_id=conv.id,
                                   answers=event.id)
    for piece in pieces:
        await store.mark_outbound(piece.id, OutboundStatus.SENT, external_message_id=piece.id)
    await store.add_usage(user, 10, 5, conversation_id=conv.id)
    return event.id, [p.id for p in pieces]


async def allowed(store: Store, *users: str) -> None:
    for user in users:
        await store.set_user_status("telegram", user.split(":")[1], UserStatus.ALLOWED)


# -- each kind, past its limit and within it ----------------------------------------------------------

async def test_the_journal_goes_after_its_days_and_a_recent_one_still_dedupes(store):
    await allowed(store, ADA)
    old_in, old_out = await answered(store, ADA, "1", "long ago")
    new_in, new_out = await answered(store, ADA, "2", "yesterday")
    await age(store, InboundEventRow, [old_in], 31, "received_at", "processed_at")
    await age(store, OutboundMessageRow, old_out, 31, "created_at", "updated_at", "sent_at")
    await age(store, InboundEventRow, [new_in], 29, "received_at", "processed_at")
    await age(store, OutboundMessageRow, new_out, 29, "created_at", "updated_at", "sent_at")
    # A reply given up on is as done as a sent one.
    failed = await store.add_reply("telegram", "1001", ["lost"])
    await store.mark_outbound(failed[0].id, OutboundStatus.FAILED, error="chat not found")
    await age(store, OutboundMessageRow, [failed[0].id], 40, "created_at", "updated_at")

    counts = await prune(store, Retention())
    assert counts == {**NOTHING, "inbound messages": 1, "outbound messages": 2}
    assert await ids(store, InboundEventRow) == {new_in}
    assert await ids(store, OutboundMessageRow) == set(new_out)
    # What dedupe needs is there: the day-old message redelivered is not new.
    assert (await store.record_inbound("telegram", "2", ADA, "1001", "yesterday"))[1] is False
    # The conversation (the agent's memory) is whole.
    conv = await store.active_conversation(ADA, "1001")
    assert [m.content for m in await store.list_messages(conv.id)] == [
        "long ago", "about long ago", "yesterday", "about yesterday"]
    assert await prune(store, Retention()) == NOTHING  # nothing left to do


async def test_pending_and_unanswered_delivery_rows_are_never_deleted(store):
    await allowed(store, ADA)
    # Received and never answered (the daemon stopped): recovered at the next start.
    waiting, _ = await store.record_inbound("telegram", "w", ADA, "1001", "still waiting")
    # Answered, but the reply was never delivered: the outbox retries it.
    event, _ = await store.record_inbound("telegram", "a", ADA, "1001", "answered")
    unsent = await store.add_reply("telegram", "1001", ["not out yet"], answers=event.id)
    await store.mark_outbound(unsent[0].id, OutboundStatus.PENDING, error="network down")
    notice = await store.add_reply("telegram", "1001", ["a notice, never sent"])
    await age(store, InboundEventRow, [waiting.id, event.id], 400, "received_at")
    await age(store, InboundEventRow, [event.id], 400, "processed_at")
    await age(store, OutboundMessageRow, [unsent[0].id, notice[0].id], 400, "created_at", "updated_at")

    assert await prune(store, Retention(keep_journal_days=2)) == NOTHING
    assert [e.id for e in await store.pending_inbound()] == [waiting.id]
    assert [o.id for o in await store.pending_outbound()] == [unsent[0].id, notice[0].id]
    assert await ids(store, InboundEventRow) == {waiting.id, event.id}
    assert (await store.list_outbound())[0].inbound_event_id == event.id  # still linked


async def test_usage_goes_after_its_days_and_today_still_counts(store):
    await store.add_usage(ADA, 1000, 1000)
    await store.add_usage(ADA, 100, 10)
    await store.add_usage(BOB, 7, 3)
    old, recent, today = sorted(await ids(store, UsageRow))
    await age(store, UsageRow, [old], 91, "at")
    await age(store, UsageRow, [recent], 89, "at")

    assert await prune(store, Retention()) == {**NOTHING, "usage rows": 1}
    assert await ids(store, UsageRow) == {recent, today}
    assert await store.tokens_today(BOB) == 10
    # keep_usage_days = 1, the least there is, still keeps all of today.
    await prune(store, Retention(keep_usage_days=1))
    assert await ids(store, UsageRow) == {today} and await store.tokens_today() == 10


async def test_audit_rows_go_after_their_days(store):
    for n in range(3):
        await store.add_audit(ADA, "shell", {"command": f"ls {n}"}, "allowed", exit_status=0)
    oldest, old, recent = sorted(await ids(store, AuditRow))
    await age(store, AuditRow, [oldest, old], 366, "at")
    await age(store, AuditRow, [recent], 364, "at")

    assert await prune(store, Retention()) == {**NOTHING, "audit rows": 2}
    assert [a.id for a in await store.list_audit()] == [recent]
    await age(store, AuditRow, [recent], 11, "at")
    assert (await prune(store, Retention(keep_audit_days=10)))["audit rows"] == 1


async def test_expired_codes_and_strangers_go_and_no_one_admitted_or_listed_does(store):
    async def stranger(n: int, days: float, code: str = "expired") -> str:
        user = await store.ensure_user("telegram", n, f"stranger {n}")
        if code:
            await store.create_pairing_code(user.key, PairingLimits(pending=100))
        if code == "expired":
            async with store.engine.begin() as conn:
                await conn.execute(update(PairingCodeRow).where(PairingCodeRow.user_id == user.id)
                                   .values(expires_at=days_ago(days)))
        await age(store, UserRow, [user.id], days, "created_at", "updated_at")
        return user.key

    gone = [await stranger(1, 8), await stranger(2, 30, code="")]  # "" : allowlist, no code
    kept = {await stranger(3, 6): "asked 6 days ago",
            await stranger(4, 30, code="live"): "a live code: the admin may approve it now",
            await stranger(5, 30): "named in the config (kept_users)"}
    # Admitted, or decided on, long ago: never deleted.
    for n, status in ((6, UserStatus.ALLOWED), (7, UserStatus.BLOCKED)):
        user = await store.set_user_status("telegram", n, status)
        await age(store, UserRow, [user.id], 400, "created_at", "updated_at")
        kept[user.key] = status
    # Sent back to pairing (`openclaw users revoke`): pending, but with a history.
    await allowed(store, "telegram:8")
    await answered(store, "telegram:8", "8", "my diary")
    await store.set_user_status("telegram", 8, UserStatus.PENDING)
    revoked = await store.set_user_status("telegram", 9, UserStatus.PENDING)
    await store.add_reminder(revoked.key, 9, "pills", days_ago(-1))
    for n in (8, 9):
        await age(store, UserRow, [(await store.get_user("telegram", n)).id], 400,
                  "created_at", "updated_at")
    kept.update({"telegram:8": "revoked, with conversations", "telegram:9": "with a reminder"})
    expired_codes = {c.code for c in await store.list_pairing_codes(include_expired=True)
                     if c.expires_at < datetime.now(UTC)}

    dry = await prune(store, Retention(), kept_users={"telegram:5"}, dry_run=True)
    assert dry == {**NOTHING, "pairing codes": 3, "pending users": 2}
    assert await prune(store, Retention(), kept_users={"telegram:5"}) == dry
    left = {u.key for u in await store.list_users()}
    assert left == set(kept), left
    assert not left & set(gone)
    codes = await store.list_pairing_codes(include_expired=True)
    assert not {c.code for c in codes} & expired_codes
    assert [c.user for c in codes] == ["telegram:4"]  # the live one
    # A deleted stranger who writes again is met as any new one: a fresh code.
    again = await store.ensure_user("telegram", 1)
    assert again.status is UserStatus.PENDING and await store.create_pairing_code(again.key)


async def test_zero_keeps_every_kind_forever(store):
    await allowed(store, ADA)
    event, out = await answered(store, ADA, "1", "old words")
    await store.add_audit(ADA, "shell", {"command": "ls"}, "allowed")
    await store.ensure_user("telegram", 4242)  # a stranger
    conv = await store.active_conversation(ADA, "1001")
    await store.archive_conversation(conv.id)
    await store.active_conversation(ADA, "1001")  # a newer one
    for table, columns in ((InboundEventRow, ("received_at", "processed_at")),
                           (OutboundMessageRow, ("created_at", "updated_at", "sent_at")),
                           (UsageRow, ("at",)), (AuditRow, ("at",)),
                           (UserRow, ("created_at", "updated_at")),
                           (ConversationRow, ("created_at", "updated_at", "archived_at"))):
        await age(store, table, await ids(store, table), 10_000, *columns)

    assert await prune(store, FOREVER) == NOTHING
    assert await prune(store, Retention()) != NOTHING  # the defaults would delete them
    assert await store.get_user("telegram", 4242) is None  # the stranger went


async def test_conversations_are_kept_unless_keep_archived_days_is_set(store):
    await allowed(store, ADA, BOB)
    await answered(store, ADA, "1", "my first chat")
    first = await store.active_conversation(ADA, "1001")
    msg = (await store.list_messages(first.id))[0]
    await store.add_summary(first.id, msg.id, "ada's summary", 3)
    await store.archive_conversation(first.id)  # /new
    await answered(store, ADA, "2", "my second chat")
    second = await store.active_conversation(ADA, "1001")
    await answered(store, BOB, "3", "bob's chat")
    bobs = await store.active_conversation(BOB, "1002")
    await store.archive_conversation(bobs.id)  # /new, a day ago
    await age(store, ConversationRow, [first.id], 100, "created_at", "updated_at", "archived_at")
    await age(store, ConversationRow, [second.id], 100, "created_at", "updated_at")
    await age(store, ConversationRow, [bobs.id], 1, "archived_at")
    everything = {t: await ids(store, t) for t in (ConversationRow, MessageRow, SummaryRow, UsageRow)}

    assert await prune(store, Retention()) == NOTHING  # the default: memory is kept
    assert {t: await ids(store, t) for t in everything} == everything

    counts = await prune(store, Retention(keep_archived_days=30))
    assert counts == {**NOTHING, "archived conversations": 1, "their messages": 2,
                      "their summaries": 1}
    assert await ids(store, ConversationRow) == {second.id, bobs.id}
    assert await store.list_messages(first.id) == []
    assert len(await store.list_messages(second.id)) == 2
    assert await ids(store, SummaryRow) == set()
    # Its usage row stays (unlinked), as does its reply until the journal's limit.
    assert await ids(store, UsageRow) == everything[UsageRow]
    async with store.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(UsageRow)
                                 .where(UsageRow.conversation_id.is_(None))) == 1
        assert await conn.scalar(select(func.count()).select_from(OutboundMessageRow)
                                 .where(OutboundMessageRow.conversation_id.is_(None))) == 1


async def test_an_old_conversations_usage_and_replies_are_unlinked_in_batches_before_it_goes(store):
    # Kept forever, they would all be unlinked (ON DELETE SET NULL) in the conversations' own
    # batch: a year of them in one transaction. They are unlinked `batch` at a time first.
    await allowed(store, ADA)
    for n in range(3):
        await answered(store, ADA, str(n), f"question {n}")
    old = await store.active_conversation(ADA, "1001")
    for _ in range(2):
        await store.add_usage(ADA, 10, 5, conversation_id=old.id)
    await store.archive_conversation(old.id)
    newer = await store.active_conversation(ADA, "1001")  # the newest is never deleted
    await store.add_usage(ADA, 10, 5, conversation_id=newer.id)
    await age(store, ConversationRow, [old.id], 100, "archived_at")
    usage, replies = await ids(store, UsageRow), await ids(store, OutboundMessageRow)
    keep_all_but_archived = Retention(0, 0, 0, 0, 30)

    async def linked(table) -> dict[int, int | None]:
        async with store.engine.connect() as conn:
            return dict((await conn.execute(select(table.id, table.conversation_id))).all())

    expected = {**NOTHING, "archived conversations": 1, "their messages": 6}
    assert await prune(store, keep_all_but_archived, dry_run=True) == expected
    assert set((await linked(UsageRow)).values()) == {old.id, newer.id}  # a dry run changes nothing

    changed: list[tuple[str, int]] = []

    def seen(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.startswith("UPDATE"):
            changed.append((statement.split()[1], cursor.rowcount))

    sqlalchemy.event.listen(store.engine.sync_engine, "after_cursor_execute", seen)
    try:
        assert await prune(store, keep_all_but_archived, batch=2) == expected
    finally:
        sqlalchemy.event.remove(store.engine.sync_engine, "after_cursor_execute", seen)
    assert changed == [("usage", 2), ("usage", 2), ("usage", 1), ("outbound_messages", 2),
                       ("outbound_messages", 1)]
    assert await ids(store, ConversationRow) == {newer.id}
    # Every usage row and reply stays; the old conversation's unlinked, the newer one's not.
    assert await ids(store, UsageRow) == usage and await ids(store, OutboundMessageRow) == replies
    assert sorted((await linked(UsageRow)).values(), key=lambda c: c or 0) == [None] * 5 + [newer.id]
    assert set((await linked(OutboundMessageRow)).values()) == {None}
    assert await store.tokens_today(ADA) == 6 * 15


async def test_the_newest_conversation_is_never_deleted_so_sqlite_never_gives_its_id_again(store):
    await allowed(store, ADA)
    conv = await store.active_conversation(ADA, "1001")
    await store.add_message(conv.id, "user", "hello")
    await store.archive_conversation(conv.id)
    await age(store, ConversationRow, [conv.id], 100, "archived_at")
    assert await prune(store, Retention(keep_archived_days=1)) == NOTHING
    newer = await store.active_conversation(ADA, "1001")
    assert newer.id != conv.id
    await store.archive_conversation(newer.id)
    await age(store, ConversationRow, [newer.id], 100, "archived_at")
    assert (await prune(store, Retention(keep_archived_days=1)))["archived conversations"] == 1
    assert await ids(store, ConversationRow) == {newer.id}


async def test_many_rows_go_in_small_transactions_and_a_stop_ends_after_the_batch(store):
    for _ in range(25):
        await store.add_audit(ADA, "clock", None, "allowed")
    await age(store, AuditRow, await ids(store, AuditRow), 400, "at")
    commits: list[int] = []
    stopping = asyncio.Event()

    def committed(conn) -> None:
        commits.append(1)
        stopping.set()  # asked to stop during the first batch: it ends, no other begins

    audit_only = Retention(0, 0, 365, 0, 0)  # audit rows first, then the pairing codes
    sqlalchemy.event.listen(store.engine.sync_engine, "commit", committed)
    try:
        assert (await prune(store, audit_only, batch=10, stopping=stopping))["audit rows"] == 10
        assert commits == [1]
        commits.clear()
        assert (await prune(store, audit_only, batch=10))["audit rows"] == 15
    finally:
        sqlalchemy.event.remove(store.engine.sync_engine, "commit", committed)
    assert len(commits) == 2 + 1  # 10 and 5 audit rows, then the pairing codes' (none)
    assert await ids(store, AuditRow) == set()


async def test_a_stop_asked_between_batches_starts_no_further_batch(store):
    for _ in range(25):
        await store.add_audit(ADA, "clock", None, "allowed")
    await age(store, AuditRow, await ids(store, AuditRow), 400, "at")
    stopping = asyncio.Event()
    first = asyncio.Event()
    sqlalchemy.event.listen(store.engine.sync_engine, "commit", lambda conn: first.set())

    async def stop_during_the_pause() -> None:
        await first.wait()  # the first batch is in; prune then pauses (0.5 s) before the next
        await asyncio.sleep(0.1)
        stopping.set()

    stopper = asyncio.create_task(stop_during_the_pause())
    audit_only = Retention(0, 0, 365, 0, 0)
    assert (await prune(store, audit_only, batch=10, pause_s=0.5, stopping=stopping))[
        "audit rows"] == 10
    await stopper
    assert len(await ids(store, AuditRow)) == 15


async def test_a_cancelled_stop_stays_cancelled(store, monkeypatch):
    # The daemon's stop, cancelled while it waits for the clean-up, must not go on as if it were not.
    from openclaw.store import retention

    running = asyncio.Event()

    async def slow_prune(*args, **kwargs):
        running.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(retention, "prune", slow_prune)
    task = RetentionTask(store, Retention(), lambda: ())
    task.start()
    await running.wait()
    stopper = asyncio.create_task(task.stop(timeout_s=3600))
    await asyncio.sleep(0.05)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert not task.running  # its clean-up was cancelled with it


async def test_the_age_indexes_come_with_an_upgrade_and_keep_the_rows(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}"
    await left_at_revision(url, "0003", (
        "INSERT INTO audit_log (at, user_key, skill, decision) "
        "VALUES ('2025-01-01 00:00:00', 'telegram:1', 'shell', 'allowed')", ()))
    async with await Store.open(url) as store:
        assert [a.skill for a in await store.list_audit()] == ["shell"]
    sync = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'openclaw.db'}")
    try:
        with sync.connect() as conn:
            inspector = sqlalchemy.inspect(conn)
            found = {(table, ix["name"]) for table in ("inbound_events", "outbound_messages",
                                                       "audit_log", "usage")
                     for ix in inspector.get_indexes(table)}
    finally:
        sync.dispose()
    assert {("inbound_events", "ix_inbound_events_status_processed_at"),
            ("outbound_messages", "ix_outbound_messages_status_updated_at"),
            ("audit_log", "ix_audit_log_at"), ("usage", "ix_usage_conversation_id")} <= found


# -- the config ---------------------------------------------------------------------------------------

def test_the_retention_keys_default_and_are_validated_naming_the_key(tmp_path: Path):
    path = tmp_path / "c.toml"
    path.write_text("")
    assert Retention.of(load_config(path).store) == Retention(30, 90, 365, 7, 0)
    for value, expected in (
            ("keep_audit_days = -1", "store.keep_audit_days = -1: expected a number >= 0"),
            ('keep_usage_days = "90"', 'store.keep_usage_days = "90": expected an integer'),
            ("keep_journal_days = 1", "store.keep_journal_days = 1: expected 0 (keep forever) or "
                                      "at least 2")):
        path.write_text(f"[store]\n{value}\n")
        with pytest.raises(Exception) as caught:
            load_config(path)
        assert expected in str(caught.value), caught.value
    path.write_text("[store]\nkeep_journal_days = 0\nkeep_archived_days = 14\n")
    assert Retention.of(load_config(path).store) == Retention(0, 90, 365, 7, 14)


def test_a_changed_retention_key_waits_for_a_restart(tmp_path: Path):
    path = tmp_path / "c.toml"
    path.write_text("")
    running = load_config(path)
    path.write_text("[store]\nkeep_audit_days = 30\n")
    serving, applied, waiting = merge(running, load_config(path))
    assert waiting == ["store"] and applied == []
    assert serving.store.keep_audit_days == 365


# -- the daemon's task --------------------------------------------------------------------------------

async def test_the_daemon_prunes_at_start_after_recovery_and_stops_the_task_cleanly(tmp_path, caplog):
    cfg = daemon_config(tmp_path)
    cfg.data_dir.mkdir(parents=True)
    async with await Store.open(cfg.store.url) as store:
        await allowed(store, ADA)
        old_in, old_out = await answered(store, ADA, "1", "long ago")
        await age(store, InboundEventRow, [old_in], 60, "received_at", "processed_at")
        await age(store, OutboundMessageRow, old_out, 60, "created_at", "updated_at")
        # Unanswered when the last daemon stopped, long ago: recovered, not deleted.
        waiting, _ = await store.record_inbound("telegram", "2", ADA, "1001", "still there?")
        await age(store, InboundEventRow, [waiting.id], 60, "received_at")
    tg = RecordingConnector("telegram")
    caplog.set_level(logging.INFO, logger="openclaw.store.retention")
    from openclaw.daemon import Daemon

    daemon = Daemon(cfg, model=ScriptedModel(lambda m: "here I am"), connectors=[tg])
    await daemon.start()
    try:
        await until(lambda: daemon.retention.runs == 1)
        await daemon.gateway.wait_idle()
        assert tg.texts("1001") == ["here I am"]  # the recovered message was answered
        assert await ids(daemon.store, InboundEventRow) == {waiting.id}
        [line] = [r.getMessage() for r in caplog.records if r.name == "openclaw.store.retention"]
        assert line == "store retention: removed inbound messages 1, outbound messages 1"
        assert daemon.retention.running  # waiting for tomorrow
        task = daemon.retention._task
    finally:
        await daemon.stop()
    assert task.done() and not task.cancelled() and task.exception() is None
    assert daemon.retention._task is None


async def test_a_stranger_removed_while_being_given_a_code_still_gets_one(tmp_path):
    # The daily run may delete a stranger's old row between the gateway's look at it and their new
    # pairing code: the code is made for them anyway, not an error out of the message's handling.
    from openclaw.daemon import Daemon

    tg = RecordingConnector("telegram")
    daemon = Daemon(daemon_config(tmp_path), model=ScriptedModel(lambda m: "no"), connectors=[tg])
    await daemon.start()
    try:
        store = daemon.store
        create = store.request_pairing
        removed: list[str] = []

        async def retention_first(user: str, *limits, **kept):
            if not removed:
                removed.append(user)
                async with store.engine.begin() as conn:
                    await conn.execute(sqlalchemy.delete(UserRow).where(UserRow.external_id == "77"))
            return await create(user, *limits, **kept)

        store.request_pairing = retention_first
        await tg.handler(msg("hello?", user="77", channel="telegram"))
        await daemon.gateway.wait_idle()
        assert removed == ["telegram:77"]
        [reply] = tg.texts("77")
        code = [c.code for c in await store.list_pairing_codes() if c.user == "telegram:77"]
        assert code and f"Your pairing code is {code[0]}" in reply
    finally:
        await daemon.stop()


async def test_the_task_runs_again_each_period_and_logs_only_when_it_removed_something(
        tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="openclaw.store.retention")
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}") as store:
        asked: list[int] = []
        task = RetentionTask(store, Retention(), lambda: asked.append(1) or {"telegram:5"},
                             every_s=0.05, pause_s=0)
        task.start()
        await until(lambda: task.runs >= 1)
        await store.add_audit(ADA, "shell", None, "allowed")
        await age(store, AuditRow, await ids(store, AuditRow), 400, "at")
        await until(lambda: task.runs >= 3)
        await task.stop()
        assert not task.running and len(asked) >= 3  # the config's names, asked at each run
        assert await ids(store, AuditRow) == set()
        lines = [r.getMessage() for r in caplog.records if r.name == "openclaw.store.retention"]
        assert lines == ["store retention: removed audit rows 1"]
        await task.stop()  # twice is harmless


# -- openclaw db prune --------------------------------------------------------------------------------

def test_db_prune_dry_run_changes_nothing_and_prints_counts_then_prunes(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[access]\nadmins = ["telegram:1"]\n'
                      "[store]\nkeep_audit_days = 0\n")
    url = f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db"

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main(["--config", str(config), "db", "prune", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = cli("--dry-run")  # a fresh install: nothing made
    assert code == 0 and "no database yet" in out and not (tmp_path / "data").exists()

    async def fill() -> None:
        async with await Store.open(url) as store:
            await allowed(store, ADA)
            old_in, old_out = await answered(store, ADA, "1", "long ago")
            await answered(store, ADA, "2", "today")
            await age(store, InboundEventRow, [old_in], 31, "processed_at")
            await age(store, OutboundMessageRow, old_out, 31, "updated_at")
            await store.add_audit(ADA, "shell", None, "allowed")
            await age(store, AuditRow, await ids(store, AuditRow), 4000, "at")
            for n in (1, 4242):  # an admin who never wrote, and a stranger
                user = await store.ensure_user("telegram", n)
                await age(store, UserRow, [user.id], 8, "created_at", "updated_at")

    async def dump() -> str:
        async with await Store.open(url) as store, store.engine.connect() as conn:
            return repr([(await conn.execute(text(f"SELECT * FROM {t} ORDER BY id"))).all()
                         for t in ("users", "inbound_events", "outbound_messages", "audit_log",
                                   "usage", "messages")])

    asyncio.run(fill())
    before = asyncio.run(dump())
    code, out, err = cli("--dry-run")
    assert code == 0, err
    assert out.splitlines()[0] == "would delete (--dry-run: nothing changed):"
    assert "  inbound messages               1  handled more than 30 days ago (keep_journal_days)\n" in out
    assert "  outbound messages              1  " in out
    assert "  audit rows                     0  kept forever (keep_audit_days = 0)\n" in out
    assert "  pending users                  1  " in out  # the stranger; not the admin
    assert asyncio.run(dump()) == before

    code, out, err = cli()
    assert code == 0, err
    assert out.splitlines()[0] == "deleted:" and "  inbound messages               1  " in out
    assert "SQLite reuses the freed pages" in out
    assert asyncio.run(dump()) != before
    code, out, _ = cli()  # nothing left
    assert code == 0 and "  inbound messages               0  " in out
    assert "SQLite reuses" not in out
