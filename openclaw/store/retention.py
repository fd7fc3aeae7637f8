"""Retention: the store deletes what is done and old, so that it stops growing with every message.

Conversations (messages, summaries) are the agent's memory and are kept, unless `[store]
keep_archived_days` is set: then those closed by /new go that many days after. What goes, by
default:

- the delivery journal, `keep_journal_days` (30) after: inbound messages handled or failed
  (the row recognises a redelivered update, which Telegram does within 24 hours) and replies
  sent or given up on. Never one still to answer or to send: those are recovered at start.
- usage rows, `keep_usage_days` (90) after: only today's count (the daily cap, /status) is read.
- audit rows, `keep_audit_days` (365) after.
- expired pairing codes at once (none can be used or is shown; an approved one whose welcome is
  still to be sent, a week at most), and strangers never admitted:
  users still `pending` with no live code, no conversation and no reminder, whose row has not
  changed for `keep_pending_users_days` (7), unless the config names them. A deleted stranger who writes
  again is met as before: a new row, a new code.

0 keeps a kind forever. `prune` works in batches of a few hundred rows, each its own short
transaction, so on SQLite the daemon's own writes wait milliseconds at most; `RetentionTask` runs
it at the daemon's start and then daily; `openclaw db prune` runs it at once. SQLite reuses the
freed pages for new rows, so the file stops growing, but does not shrink (VACUUM would, and is
not needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, exists, func, select, update
from sqlalchemy.sql.elements import ColumnElement

from openclaw.store.models import (
    AuditRow,
    ConversationRow,
    InboundEventRow,
    MessageRow,
    OutboundMessageRow,
    PairingCodeRow,
    ReminderRow,
    SummaryRow,
    UsageRow,
    UserRow,
)
from openclaw.store.records import (
    ConversationStatus,
    InboundStatus,
    OutboundStatus,
    UserStatus,
    user_key,
)
from openclaw.store.store import Store

log = logging.getLogger(__name__)

DAY_S = 24 * 3600
BATCH = 500  # rows per transaction: a few milliseconds of SQLite's write lock


@dataclass(frozen=True)
class Retention:
    """Days each kind of row is kept (the `[store] keep_*_days` keys); 0 keeps it forever."""

    keep_journal_days: int = 30
    keep_usage_days: int = 90
    keep_audit_days: int = 365
    keep_pending_users_days: int = 7
    keep_archived_days: int = 0

    @classmethod
    def of(cls, settings: Any) -> Retention:
        """From an object with the same attribute names: the config's `[store]`."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


# What `prune` counts, in the order `openclaw db prune` shows it.
KINDS = ("inbound messages", "outbound messages", "usage rows", "audit rows", "pairing codes",
         "pending users", "archived conversations", "their messages", "their summaries")


def rules(retention: Retention) -> dict[str, str]:
    """What goes of each kind under `retention`, in a few words (the CLI's right-hand column)."""
    def rule(days: int, key: str, what: str) -> str:
        return f"kept forever ({key} = 0)" if not days else f"{what.format(days=days)} ({key})"

    r = retention
    return {
        "inbound messages": rule(r.keep_journal_days, "keep_journal_days",
                                 "handled more than {days} days ago"),
        "outbound messages": rule(r.keep_journal_days, "keep_journal_days",
                                  "sent or given up on more than {days} days ago"),
        "usage rows": rule(r.keep_usage_days, "keep_usage_days", "older than {days} days"),
        "audit rows": rule(r.keep_audit_days, "keep_audit_days", "older than {days} days"),
        "pairing codes": "expired",
        "pending users": rule(r.keep_pending_users_days, "keep_pending_users_days",
                              "never admitted, no live code, unchanged for {days} days"),
        "archived conversations": rule(r.keep_archived_days, "keep_archived_days",
                                       "closed by /new more than {days} days ago"),
        "their messages": "with their conversation",
        "their summaries": "with their conversation",
    }


@dataclass(frozen=True)
class _Step:
    kind: str
    table: Any  # an ORM class with an integer `id`
    where: ColumnElement[bool]
    # A column set to NULL in the chosen rows, which stay: a step that is no kind of its own (not
    # counted, skipped by a dry run) and only spreads the next step's ON DELETE SET NULL over batches.
    unlink: str | None = None


def _not_newest(table: Any) -> ColumnElement[bool]:
    """Not the table's newest row: SQLite gives the highest id again once its row is deleted,
    and a running daemon knows conversations by id (its lanes, the model's prompt cache)."""
    return table.id < select(func.max(table.id)).correlate(None).scalar_subquery()


def _steps(r: Retention, now: datetime) -> list[_Step]:
    """Each kind's rows that go, in an order that deletes what refers to a row before the row.
    (Pending users are apart: the config's names are checked in Python.)"""
    def cutoff(days: int) -> datetime:
        return now - timedelta(days=days)

    steps = []
    if r.keep_journal_days:
        since = cutoff(r.keep_journal_days)
        steps.append(_Step("outbound messages", OutboundMessageRow, and_(
            OutboundMessageRow.status.in_([OutboundStatus.SENT, OutboundStatus.FAILED]),
            OutboundMessageRow.updated_at < since)))
        unsent_reply = exists().where(OutboundMessageRow.inbound_event_id == InboundEventRow.id,
                                      OutboundMessageRow.status == OutboundStatus.PENDING)
        steps.append(_Step("inbound messages", InboundEventRow, and_(
            InboundEventRow.status.in_([InboundStatus.PROCESSED, InboundStatus.FAILED]),
            InboundEventRow.processed_at < since, ~unsent_reply)))
    if r.keep_usage_days:
        steps.append(_Step("usage rows", UsageRow, UsageRow.at < cutoff(r.keep_usage_days)))
    if r.keep_audit_days:
        steps.append(_Step("audit rows", AuditRow, AuditRow.at < cutoff(r.keep_audit_days)))
    # An approved code whose welcome the daemon has not taken yet (Store.take_welcomes) waits for
    # it, a week at most: it holds the stranger's first message, still to be answered.
    welcome_due = and_(PairingCodeRow.used_at.is_not(None), PairingCodeRow.chat_id.is_not(None),
                       PairingCodeRow.expires_at > now - timedelta(days=7))
    steps.append(_Step("pairing codes", PairingCodeRow,
                       and_(PairingCodeRow.expires_at < now, ~welcome_due)))
    if r.keep_archived_days:
        old = select(ConversationRow.id).where(
            ConversationRow.status == ConversationStatus.ARCHIVED,
            ConversationRow.archived_at < cutoff(r.keep_archived_days),
            _not_newest(ConversationRow)).correlate(None)
        steps += [
            _Step("their messages", MessageRow, MessageRow.conversation_id.in_(old)),
            _Step("their summaries", SummaryRow, SummaryRow.conversation_id.in_(old)),
            # Their usage rows and replies stay, unlinked first in batches of their own: left to
            # ON DELETE SET NULL, one batch of conversations would unlink all their rows in one
            # transaction (a year's: 1.6 s of SQLite's write lock, bench/store_scale.py).
            _Step("their usage rows", UsageRow, UsageRow.conversation_id.in_(old),
                  unlink="conversation_id"),
            _Step("their replies", OutboundMessageRow, OutboundMessageRow.conversation_id.in_(old),
                  unlink="conversation_id"),
            _Step("archived conversations", ConversationRow, ConversationRow.id.in_(old)),
        ]
    return steps


def _strangers(r: Retention, now: datetime) -> ColumnElement[bool]:
    """Users nobody admitted and who wait for nothing: pending, no live code, never had a
    conversation or a reminder (a user sent back to pairing keeps their history)."""
    live_code = exists().where(PairingCodeRow.user_id == UserRow.id, PairingCodeRow.used_at.is_(None),
                               PairingCodeRow.expires_at > now)
    conversation = exists().where(ConversationRow.user_id == UserRow.id)
    reminder = exists().where(ReminderRow.user == UserRow.channel + ":" + UserRow.external_id)
    return and_(UserRow.status == UserStatus.PENDING,
                UserRow.updated_at < now - timedelta(days=r.keep_pending_users_days),
                ~live_code, ~conversation, ~reminder)


async def prune(store: Store, retention: Retention, *, kept_users: Iterable[str] = (),
                dry_run: bool = False, batch: int = BATCH, pause_s: float = 0.0,
                stopping: asyncio.Event | None = None) -> dict[str, int]:
    """Delete what `retention` no longer keeps; how many rows of each kind went (with `dry_run`,
    how many would: nothing changes). `kept_users` ("channel:id") are never deleted, pending or
    not: the ones the config names. Each batch of `batch` rows is its own transaction, with
    `pause_s` between batches; once `stopping` is set no further batch starts."""
    now = store.now()
    counts = dict.fromkeys(KINDS, 0)

    def stopped() -> bool:
        return stopping is not None and stopping.is_set()

    for step in _steps(retention, now):
        if stopped():
            break
        if step.unlink is not None:  # not counted: the rows stay
            if not dry_run:
                await _delete(store, step, batch, pause_s, stopped)
            continue
        if dry_run:
            counts[step.kind] = await _count(store, step)
        else:
            counts[step.kind] = await _delete(store, step, batch, pause_s, stopped)
    if retention.keep_pending_users_days and not stopped():
        counts["pending users"] = await _delete_strangers(
            store, _strangers(retention, now), set(kept_users), dry_run, batch, pause_s, stopped)
    return counts


async def _count(store: Store, step: _Step) -> int:
    async with store.engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(step.table).where(step.where)))


async def _delete(store: Store, step: _Step, batch: int, pause_s: float,
                  stopped: Callable[[], bool]) -> int:
    """Delete the step's rows (or unlink them, `_Step.unlink`), `batch` at a time; how many."""
    table, total = step.table, 0
    # No ORDER BY: the planner picks the age index; which old rows go first does not matter.
    chosen = select(table.id).where(step.where).limit(batch).correlate(None)
    change = delete(table) if step.unlink is None else update(table).values({step.unlink: None})
    while True:
        async with store.engine.begin() as conn:
            gone = (await conn.execute(change.where(table.id.in_(chosen)))).rowcount
        total += gone
        if gone < batch or stopped():
            return total
        await asyncio.sleep(pause_s)
        if stopped():  # asked during the pause: no further batch
            return total


async def _delete_strangers(store: Store, where: ColumnElement[bool], kept: set[str], dry_run: bool,
                            batch: int, pause_s: float, stopped: Callable[[], bool]) -> int:
    total, after = 0, 0
    while not stopped():
        async with store.engine.begin() as conn:
            rows = (await conn.execute(
                select(UserRow.id, UserRow.channel, UserRow.external_id)
                .where(where, UserRow.id > after).order_by(UserRow.id).limit(batch))).all()
            if not rows:
                break
            after = rows[-1].id
            ids = [row.id for row in rows if user_key(row.channel, row.external_id) not in kept]
            if dry_run or not ids:
                total += len(ids)
            else:
                # The same test again: the admin may have let one in since the look (their
                # pairing codes, all expired or used, go with them: ON DELETE CASCADE).
                total += (await conn.execute(delete(UserRow).where(UserRow.id.in_(ids), where))).rowcount
        if len(rows) < batch:
            break
        if not dry_run:
            await asyncio.sleep(pause_s)
    return total


def summary(counts: dict[str, int]) -> str:
    """"inbound messages 8042, outbound messages 9316" (the kinds that had rows removed)."""
    return ", ".join(f"{kind} {n}" for kind, n in counts.items() if n)


class RetentionTask:
    """The daemon's clean-up: `prune` at start, then every `every_s` (a day), until stopped. It
    pauses between batches so that turns are never kept waiting on the store, and logs one INFO
    line when it removed anything. `kept_users` is asked at each run (a reload may change it)."""

    def __init__(self, store: Store, retention: Retention, kept_users: Callable[[], Iterable[str]],
                 *, every_s: float = DAY_S, pause_s: float = 0.05, batch: int = BATCH) -> None:
        self.store, self.retention, self.kept_users = store, retention, kept_users
        self.every_s, self.pause_s, self.batch = every_s, pause_s, batch
        self.runs = 0  # finished runs, failed ones included
        self._stopping = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="openclaw-retention")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run_once(self) -> dict[str, int]:
        counts = await prune(self.store, self.retention, kept_users=self.kept_users(),
                             batch=self.batch, pause_s=self.pause_s, stopping=self._stopping)
        if any(counts.values()):
            log.info("store retention: removed %s", summary(counts))
        return counts

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.run_once()
            except Exception:  # the store was busy or gone: the next run tries again
                log.exception("store retention: the clean-up failed; it runs again in %.0f hours",
                              self.every_s / 3600)
            self.runs += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.every_s)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the batch in progress (one short transaction); cancelled if it hangs."""
        if self._task is None:
            return
        self._stopping.set()
        try:
            await asyncio.wait_for(self._task, timeout_s)
        except TimeoutError:
            log.warning("store retention: a batch did not end within %.0f s; cancelled", timeout_s)
        except asyncio.CancelledError:
            # wait_for cancels the task and raises this both when we are cancelled (stop too) and
            # when the task was cancelled from elsewhere (it has stopped then: nothing to do).
            if asyncio.current_task().cancelling():
                raise
        self._task = None
