"""The delivery journal: each inbound message, stored before it is acknowledged; each outbound
piece, stored pending for the outbox in the same transaction as what it stands for (the message it
answers marked processed, the reminder it delivers moved on), so a crash neither loses a reply nor
runs a turn or fires a reminder twice."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import (
    NOT_DONE,
    StoreBase,
    commits_next,
    insert_record,
    loop_first,
    loop_insert,
    to_record,
)
from openclaw.store.loop_writer import LoopWriter
from openclaw.store.models import InboundEventRow, OutboundMessageRow, ReminderRow
from openclaw.store.records import (
    InboundEvent,
    InboundStatus,
    OutboundMessage,
    OutboundStatus,
    ReminderStatus,
    parse_user_key,
)


@functools.cache
def _answered() -> Any:
    """The UPDATE that marks an inbound message answered (add_reply, before every reply is sent):
    built once, its values as parameters (construction cost more than the statement)."""
    table = InboundEventRow.__table__
    return (update(table).where(table.c.id == bindparam("event_id"))
            .values(status=InboundStatus.PROCESSED, processed_at=bindparam("processed"),
                    error=None))


@functools.cache
def _sent(with_external_id: bool) -> Any:
    """mark_sent's UPDATE (after every piece sent), built once: the columns _attempt sets for a
    sent piece, its values as parameters; the id the service gave, where it gave one."""
    table = OutboundMessageRow.__table__
    values: dict[str, Any] = {"status": OutboundStatus.SENT, "attempts": table.c.attempts + 1,
                              "error": None, "updated_at": bindparam("now"),
                              "sent_at": bindparam("now")}
    if with_external_id:
        values["external_message_id"] = bindparam("external_id")
    return (update(table).where(table.c.id == bindparam("outbound_id"),
                                table.c.status != OutboundStatus.SENT).values(values))


# -- the same writes on the loop's writer (base.loop_first) -----------------------------------------


def _record_inbound_on_loop(store: StoreBase, writer: LoopWriter, channel: str,
                            message_id: str | int, user: str, chat_id: str | int, text: str,
                            payload: Any | None = None) -> tuple[InboundEvent, bool]:
    """A redelivery (the unique index refuses it) runs the ordinary path, which finds the row."""
    try:
        parse_user_key(user)
    except ValueError:
        return NOT_DONE
    values = dict(channel=channel, message_id=str(message_id), user=user, chat_id=str(chat_id),
                  text=text, payload=payload, status=InboundStatus.RECEIVED, error=None,
                  received_at=store.now(), processed_at=None)
    done = writer.write([loop_insert(writer, InboundEventRow, values)])
    return NOT_DONE if done is None else (InboundEvent(id=done[0][1], **values), True)


def _add_reply_on_loop(store: StoreBase, writer: LoopWriter, channel: str, chat_id: str | int,
                       pieces: list[str], *, conversation_id: int | None = None,
                       answers: int | None = None) -> list[OutboundMessage]:
    """The "answered" UPDATE and the pieces' INSERTs, one transaction."""
    now = store.now()
    steps = []
    if answers is not None:
        steps.append((writer.prepare("answered", _answered),
                      {"event_id": answers, "processed": now}))
    rows = [dict(conversation_id=conversation_id, inbound_event_id=answers, channel=channel,
                 chat_id=str(chat_id), text=piece, status=OutboundStatus.PENDING, attempts=0,
                 external_message_id=None, error=None, created_at=now, updated_at=now,
                 sent_at=None) for piece in pieces]
    steps += [loop_insert(writer, OutboundMessageRow, row) for row in rows]
    done = writer.write(steps) if steps else []
    if done is None:
        return NOT_DONE
    return [OutboundMessage(id=lastrowid, **row)
            for row, (_count, lastrowid) in zip(rows, done[len(done) - len(rows):], strict=True)]


def _mark_sent_on_loop(store: StoreBase, writer: LoopWriter, outbound_id: int,
                       external_message_id: str | int | None) -> None:
    """No row changed (none such, or already sent): the ordinary path finds out which, and
    raises."""
    parameters = {"outbound_id": outbound_id, "now": store.now()}
    if external_message_id is not None:
        parameters["external_id"] = str(external_message_id)
    with_id = external_message_id is not None
    done = writer.write([(writer.prepare(("sent", with_id), lambda: _sent(with_id)), parameters)])
    return None if done is not None and done[0][0] == 1 else NOT_DONE


class JournalStore(StoreBase):
    """The Store's inbound and outbound messages."""

    # -- inbound -------------------------------------------------------------------------------

    @loop_first(_record_inbound_on_loop)
    async def record_inbound(self, channel: str, message_id: str | int, user: str, chat_id: str | int,
                             text: str, payload: Any | None = None) -> tuple[InboundEvent, bool]:
        """Persist an incoming message before it is acknowledged. `is_new` is False for a redelivery
        (same channel and message id), which must not be answered again."""
        parse_user_key(user)
        message_id, chat_id = str(message_id), str(chat_id)
        try:
            async with self.transaction() as session:
                event = await insert_record(
                    session, InboundEventRow, InboundEvent, last=True, channel=channel,
                    message_id=message_id,
                    user=user, chat_id=chat_id, text=text, payload=payload,
                    status=InboundStatus.RECEIVED, error=None, received_at=self.now(),
                    processed_at=None)
                return event, True
        except IntegrityError as clash:
            # The unique (channel, message_id) index decides races, on SQLite and PostgreSQL alike.
            async with self.transaction() as session:
                row = await session.scalar(select(InboundEventRow).where(
                    InboundEventRow.channel == channel, InboundEventRow.message_id == message_id))
                if row is None:
                    raise clash
                return to_record(InboundEvent, row), False

    async def mark_inbound(self, event_id: int, status: InboundStatus | str,
                           error: str | None = None) -> None:
        status = InboundStatus(status)
        async with self.transaction() as session:
            done = None if status is InboundStatus.RECEIVED else self.now()
            result = await session.execute(
                update(InboundEventRow).where(InboundEventRow.id == event_id)
                .values(status=status, processed_at=done, error=error)
                .execution_options(synchronize_session=False))
            if result.rowcount != 1:
                raise LookupError(f"inbound event {event_id} does not exist")

    async def pending_inbound(self, limit: int | None = None) -> list[InboundEvent]:
        """Events received but neither processed nor failed, oldest first (crash recovery)."""
        query = (select(InboundEventRow).where(InboundEventRow.status == InboundStatus.RECEIVED)
                 .order_by(InboundEventRow.id).limit(limit))
        async with self.transaction() as session:
            return [to_record(InboundEvent, row) for row in await session.scalars(query)]

    # -- outbound: what the outbox is to send --------------------------------------------------

    @loop_first(_add_reply_on_loop, steps=("_add_outbound",))
    async def add_reply(self, channel: str, chat_id: str | int, pieces: list[str], *,
                        conversation_id: int | None = None,
                        answers: int | None = None) -> list[OutboundMessage]:
        """Store a reply's pieces as pending and, in the same transaction, mark the inbound event
        it `answers` processed: after a crash the reply is re-sent (the outbox) but the turn is
        never run a second time."""
        async with self.transaction() as session:
            if answers is not None:
                await session.execute(_answered(), {"event_id": answers,
                                                    "processed": self.now()})
            return await self._add_outbound(session, channel, chat_id, pieces, conversation_id,
                                            answers, last=True)

    async def fire_reminder(self, reminder_id: int, due_at: datetime, next_due: datetime | None,
                            pieces: list[str], *, conversation_id: int | None = None
                            ) -> list[OutboundMessage] | None:
        """One delivery of the reminder that was due at `due_at`, in one transaction: it moves to
        `next_due` (None: done) and `pieces` are stored for the outbox to send. None, and nothing
        stored, when it was cancelled or already delivered meanwhile."""
        async with self.transaction() as session:
            now = self.now()
            moved = await session.execute(
                update(ReminderRow)
                .where(ReminderRow.id == reminder_id, ReminderRow.status == ReminderStatus.ACTIVE,
                       ReminderRow.due_at == due_at)
                .values(due_at=next_due or due_at, fired_at=now,
                        fired_count=ReminderRow.fired_count + 1,
                        status=ReminderStatus.ACTIVE if next_due else ReminderStatus.DONE)
                .execution_options(synchronize_session=False))
            if moved.rowcount != 1:
                return None
            row = await session.get(ReminderRow, reminder_id)
            return await self._add_outbound(session, row.channel, row.chat_id, pieces,
                                            conversation_id, None)

    async def _add_outbound(self, session: AsyncSession, channel: str, chat_id: str | int,
                            pieces: list[str], conversation_id: int | None,
                            answers: int | None, last: bool = False) -> list[OutboundMessage]:
        """`last`: these INSERTs end the transaction (the last commits it: base.commits_next)."""
        now = self.now()
        # One INSERT per piece, in order: the ids keep the order the pieces are sent in.
        return [await insert_record(session, OutboundMessageRow, OutboundMessage,
                                    last and i == len(pieces) - 1,
                                    conversation_id=conversation_id, inbound_event_id=answers,
                                    channel=channel, chat_id=str(chat_id), text=piece,
                                    status=OutboundStatus.PENDING, attempts=0,
                                    external_message_id=None, error=None, created_at=now,
                                    updated_at=now, sent_at=None)
                for i, piece in enumerate(pieces)]

    async def mark_outbound(self, outbound_id: int, status: OutboundStatus | str,
                            external_message_id: str | int | None = None,
                            error: str | None = None) -> OutboundMessage:
        """Record one delivery attempt: attempts += 1, `error` is the latest attempt's (None clears).

        `pending` means "try again"; `sent` is final and sets sent_at.
        """
        status = OutboundStatus(status)
        values = self._attempt(status, external_message_id, error)
        row_cls = OutboundMessageRow
        every_column = [column.label(key) for key, column in row_cls.__mapper__.columns.items()]
        async with self.transaction() as session:
            # The WHERE keeps a sent message's status final. Then the row is read back: not by
            # RETURNING, which SQLite has only from 3.35 (Debian 11 and RHEL 9 ship 3.34).
            changed = await session.execute(
                update(row_cls.__table__)
                .where(row_cls.id == outbound_id, row_cls.status != OutboundStatus.SENT)
                .values(values))
            row = (await session.execute(
                select(*every_column).where(row_cls.id == outbound_id))).one_or_none()
            if row is None:
                raise LookupError(f"outbound message {outbound_id} does not exist")
            if changed.rowcount != 1:
                raise ValueError(f"outbound message {outbound_id} was already sent; its status is final")
            return to_record(OutboundMessage, row)

    @loop_first(_mark_sent_on_loop, after_reply=True)
    async def mark_sent(self, outbound_id: int, external_message_id: str | int | None) -> None:
        """`mark_outbound(outbound_id, "sent", external_message_id)` without reading the row back:
        the outbox's call after each piece it sends, one statement where that is two. The row is
        read only to say what is wrong (LookupError, ValueError) when the UPDATE changed none."""
        row_cls = OutboundMessageRow
        async with self.transaction() as session:
            await commits_next(session)  # the read below is only for the error
            now = self.now()
            parameters = {"outbound_id": outbound_id, "now": now}
            if external_message_id is not None:
                parameters["external_id"] = str(external_message_id)
            changed = await session.execute(_sent(external_message_id is not None), parameters)
            if changed.rowcount == 1:
                return
            if await session.scalar(select(row_cls.id).where(row_cls.id == outbound_id)) is None:
                raise LookupError(f"outbound message {outbound_id} does not exist")
            raise ValueError(f"outbound message {outbound_id} was already sent; its status is final")

    def _attempt(self, status: OutboundStatus, external_message_id: str | int | None,
                 error: str | None) -> dict[Any, Any]:
        """The columns one delivery attempt sets (mark_outbound, mark_sent)."""
        row_cls, now = OutboundMessageRow, self.now()
        values: dict[Any, Any] = {row_cls.status: status, row_cls.attempts: row_cls.attempts + 1,
                                  row_cls.error: error, row_cls.updated_at: now}
        if external_message_id is not None:
            values[row_cls.external_message_id] = str(external_message_id)
        if status is OutboundStatus.SENT:
            values[row_cls.sent_at] = now
        return values

    async def fail_unsent(self, outbound_ids: Iterable[int], error: str) -> int:
        """Give up those of `outbound_ids` still pending (pieces that lost their meaning before
        they went out); how many. Sent ones stay as they are."""
        row_cls = OutboundMessageRow
        async with self.transaction() as session:
            result = await session.execute(
                update(row_cls.__table__)
                .where(row_cls.id.in_(list(outbound_ids)), row_cls.status == OutboundStatus.PENDING)
                .values(status=OutboundStatus.FAILED, error=error, updated_at=self.now()))
            return result.rowcount

    async def list_outbound(self, limit: int = 100) -> list[OutboundMessage]:
        """Oldest first, every status: what was sent, what waits for a retry, what failed."""
        query = select(OutboundMessageRow).order_by(OutboundMessageRow.id).limit(limit)
        async with self.transaction() as session:
            return [to_record(OutboundMessage, row) for row in await session.scalars(query)]

    async def pending_outbound(self, channel: str | None = None, chat_id: str | None = None,
                               limit: int | None = None) -> list[OutboundMessage]:
        """Oldest first; all chats, or one."""
        query = select(OutboundMessageRow).where(OutboundMessageRow.status == OutboundStatus.PENDING)
        if channel is not None:
            query = query.where(OutboundMessageRow.channel == channel,
                                OutboundMessageRow.chat_id == str(chat_id))
        query = query.order_by(OutboundMessageRow.id).limit(limit)
        async with self.transaction() as session:
            return [to_record(OutboundMessage, row) for row in await session.scalars(query)]
