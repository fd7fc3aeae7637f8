"""Reminders: what a user asked to be reminded of, when, in which chat, and whether it repeats.
Each user numbers theirs 1, 2, 3... (what they see and type). Their delivery, which also queues a
reply, is the journal's (`fire_reminder`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import StoreBase, to_record
from openclaw.store.models import ReminderRow
from openclaw.store.records import Reminder, ReminderStatus, parse_user_key


class _NoRoom(Exception):
    """Rolls back a reminder that would take a user past their limit."""


async def change_chat_reminders(session: AsyncSession, channel: str, chat_id: str,
                                values: dict[str, Any]) -> list[Reminder]:
    """Set `values` on every active reminder meant for this chat, in `session`; those changed."""
    rows = list(await session.scalars(
        select(ReminderRow).where(ReminderRow.channel == channel,
                                  ReminderRow.chat_id == str(chat_id),
                                  ReminderRow.status == ReminderStatus.ACTIVE)
        .order_by(ReminderRow.id)))
    for row in rows:
        for key, value in values.items():
            setattr(row, key, value)
    await session.flush()
    return [to_record(Reminder, row) for row in rows]


class ReminderStore(StoreBase):
    """The Store's reminders."""

    async def add_reminder(self, user: str, chat_id: str | int, text: str, due_at: datetime, *,
                           repeat: str | None = None, timezone: str = "UTC",
                           local_time: str | None = None,
                           max_active: int | None = None) -> Reminder | None:
        """A reminder delivered to `chat_id` on the user's channel at `due_at`, meant as wall-clock
        `local_time` in `timezone` (default: due_at's there); None, and nothing stored, when the
        user would have more than `max_active` active ones. It gets the user's next number: one
        more than any of theirs, cancelled and done ones included, so none is ever given twice."""
        channel, _ = parse_user_key(user)
        if local_time is None:
            local_time = due_at.astimezone(ZoneInfo(timezone)).time().isoformat()
        # Read by the INSERT itself, so no other add of this user can come in between: on SQLite
        # the INSERT holds the write lock before it reads, on PostgreSQL the advisory lock below
        # makes a second add wait. UNIQUE (user_key, number) is the backstop (and `retrying`).
        next_number = (select(func.coalesce(func.max(ReminderRow.number), 0) + 1)
                       .where(ReminderRow.user == user).scalar_subquery())

        async def op(session: AsyncSession) -> Reminder:
            if self.dialect == "postgresql":
                # Also keeps two adds at once from both seeing room under max_active.
                await session.execute(select(func.pg_advisory_xact_lock(func.hashtext(user))))
            row = ReminderRow(number=next_number, user=user, channel=channel, chat_id=str(chat_id),
                              text=text, due_at=due_at, repeat=repeat, timezone=timezone,
                              local_time=local_time, status=ReminderStatus.ACTIVE, fired_count=0,
                              created_at=self.now(), fired_at=None)
            session.add(row)
            await session.flush()
            await session.refresh(row, ["number"])  # the database worked it out
            if max_active is not None and await session.scalar(
                    select(func.count()).select_from(ReminderRow).where(
                        ReminderRow.user == user, ReminderRow.status == ReminderStatus.ACTIVE)
            ) > max_active:
                raise _NoRoom
            return to_record(Reminder, row)

        try:
            return await self.retrying(op)
        except _NoRoom:  # rolled back
            return None

    async def active_reminders(self, user: str | None = None, *, due_by: datetime | None = None,
                               exclude: Iterable[int] = (), limit: int | None = None) -> list[Reminder]:
        """Active reminders, soonest first: one user's or everyone's, those due by `due_by`,
        without the ids in `exclude`."""
        query = select(ReminderRow).where(ReminderRow.status == ReminderStatus.ACTIVE)
        if user is not None:
            query = query.where(ReminderRow.user == user)
        if due_by is not None:
            query = query.where(ReminderRow.due_at <= due_by)
        if exclude := list(exclude):
            query = query.where(ReminderRow.id.not_in(exclude))
        query = query.order_by(ReminderRow.due_at, ReminderRow.id).limit(limit)
        async with self.transaction() as session:
            return [to_record(Reminder, row) for row in await session.scalars(query)]

    async def cancel_reminder(self, user: str, number: int) -> Reminder | None:
        """Cancel the user's own active reminder by the number they see; None when they have no
        active one with that number."""
        mine = (ReminderRow.user == user, ReminderRow.number == number)
        async with self.transaction() as session:
            # A conditional UPDATE: one delivered meanwhile stays done, not cancelled.
            result = await session.execute(
                update(ReminderRow).where(*mine, ReminderRow.status == ReminderStatus.ACTIVE)
                .values(status=ReminderStatus.CANCELLED).execution_options(synchronize_session=False))
            if result.rowcount != 1:
                return None
            return to_record(Reminder, await session.scalar(select(ReminderRow).where(*mine)))

    async def cancel_chat_reminders(self, channel: str, chat_id: str | int) -> list[Reminder]:
        """Cancel every active reminder meant for this chat (it refuses the bot for good);
        the ones cancelled."""
        async with self.transaction() as session:
            return await change_chat_reminders(session, channel, str(chat_id),
                                               {"status": ReminderStatus.CANCELLED})
