"""Reminders: the book the `reminders` skill writes into (the store), fired by the daemon's
scheduler (openclaw.scheduler): each active reminder has a trigger at its due time, under the key
"reminder:ID". The store is the only truth: a reminder is active until a delivery is recorded, so
one that falls due while the daemon is down is sent at the next start (saying it is late), and a
repeating one then moves to its next time still ahead and gets its next trigger."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from apscheduler.triggers.date import DateTrigger

from openclaw.scheduler.core import JobScheduler
from openclaw.store import Reminder, ReminderStatus, Store

log = logging.getLogger(__name__)

MAX_ACTIVE = 100  # per user: a runaway model loop must not fill the table
POLL_S = 60.0  # a reminder held back (its channel away) is tried again after this, or at retry_now
LATE_S = 120  # a delivery later than this says so
REPEATS = ("daily", "weekdays", "weekly")
KEY_PREFIX = "reminder:"

# Hands one due reminder to whoever sends it: True once it was handled (sent, or dropped because
# its user is no longer allowed), False to try again later (its channel is not running).
Deliver = Callable[[Reminder], Awaitable[bool]]


class Reminders:
    def __init__(self, store: Store, scheduler: JobScheduler | None = None, *,
                 max_active: int = MAX_ACTIVE, poll_s: float = POLL_S) -> None:
        self.store, self.scheduler, self.max_active, self.poll_s = store, scheduler, max_active, poll_s
        self._deliver: Deliver | None = None
        self.held: set[int] = set()  # ids tried while their channel was away, tried again soon
        self.firing: set[int] = set()  # ids being delivered now: sync leaves their triggers be

    # ---- the book (what the skill calls) ------------------------------------------------------

    def now(self) -> datetime:
        return self.store.now()

    async def add(self, user: str, chat_id: str, text: str, due_at: datetime, *,
                  repeat: str | None, timezone: str) -> Reminder | None:
        """None when the user already has `max_active` active reminders. `due_at` given in
        `timezone` keeps the wall-clock time it names for the repeats, even one that does not
        exist on its first day (02:30 in a DST gap fires at 03:30 then, at 02:30 after)."""
        if repeat is not None and repeat not in REPEATS:
            raise ValueError(f"repeat must be one of {REPEATS}, not {repeat!r}")
        zone = ZoneInfo(timezone)  # a bad name fails here, not when the reminder repeats
        local = due_at if getattr(due_at.tzinfo, "key", None) == timezone else due_at.astimezone(zone)
        reminder = await self.store.add_reminder(
            user, chat_id, text, due_at.astimezone(UTC), repeat=repeat, timezone=timezone,
            local_time=local.time().isoformat(), max_active=self.max_active)
        if reminder is not None:
            self._schedule(reminder)
        return reminder

    async def pending(self, user: str) -> list[Reminder]:
        return await self.store.active_reminders(user)

    async def cancel(self, user: str, number: int) -> Reminder | None:
        """Cancel by the number the user sees (theirs alone), not the internal id."""
        cancelled = await self.store.cancel_reminder(user, number)
        if cancelled is not None and self._firing():
            self.scheduler.remove(f"{KEY_PREFIX}{cancelled.id}")
        return cancelled

    def retry_now(self) -> None:
        """A channel is back (a console attached, a service reachable again): the due reminders
        held back meanwhile are tried at once, not after poll_s."""
        if self._firing():
            for reminder_id in list(self.held):
                self.scheduler.put(f"{KEY_PREFIX}{reminder_id}", DateTrigger(self.now()))

    # ---- firing (the scheduler's calls) -------------------------------------------------------

    def start(self, deliver: Deliver) -> None:
        """Deliver through `deliver` from now on; `sync` schedules what is in the table."""
        self._deliver = deliver

    async def stop(self) -> None:
        """Deliver nothing more; what is not yet recorded as delivered stays due (its trigger
        too, in the scheduler's table) for the next start."""
        self._deliver = None

    async def sync(self) -> None:
        """Give each active reminder its trigger at its due time (kept when it has it already,
        so one missed while down fires at once); drop the triggers of all others."""
        if not self._firing():
            return
        active = await self.store.active_reminders()
        wanted = {f"{KEY_PREFIX}{r.id}" for r in active}
        for key in self.scheduler.keys(KEY_PREFIX):
            if key not in wanted:
                self.scheduler.remove(key)
        for reminder in active:
            if reminder.id not in self.held and reminder.id not in self.firing:
                self._schedule(reminder)

    async def fire(self, reminder_id: int) -> None:
        """The scheduler's call at a reminder's time: delivered (and, repeating, scheduled at its
        next time), or held back for poll_s when its channel cannot take it now."""
        reminder = next((r for r in await self.store.active_reminders(due_by=self.now())
                         if r.id == reminder_id), None)
        if reminder is None or self._deliver is None:  # cancelled, done, or not yet due
            await self.sync()
            return
        self.firing.add(reminder_id)
        try:
            handled = await self._deliver(reminder)
        except Exception:
            log.exception("delivering reminder id %d failed", reminder.id)
            handled = False
        finally:
            self.firing.discard(reminder_id)
        if not handled and self._firing():
            self.held.add(reminder.id)
            self.scheduler.put(f"{KEY_PREFIX}{reminder.id}",
                               DateTrigger(self.now() + timedelta(seconds=self.poll_s)))
            return
        self.held.discard(reminder.id)
        after = next((r for r in await self.store.active_reminders() if r.id == reminder_id), None)
        if after is not None and after.status == ReminderStatus.ACTIVE:
            self._schedule(after)

    def _firing(self) -> bool:
        return self.scheduler is not None and self.scheduler.running

    def _schedule(self, reminder: Reminder) -> None:
        if self._firing():
            self.scheduler.put(f"{KEY_PREFIX}{reminder.id}", DateTrigger(reminder.due_at))


def next_time(reminder: Reminder, now: datetime) -> datetime | None:
    """When a repeating reminder fires next, after `now`: its wall-clock time in its zone on the
    next day it repeats on (so 08:00 daily stays 08:00 across DST changes); None for a one-off."""
    if reminder.repeat is None:
        return None
    zone = ZoneInfo(reminder.timezone)
    wall = time.fromisoformat(reminder.local_time)
    day = reminder.due_at.astimezone(zone).date()
    while True:
        day += timedelta(days=7 if reminder.repeat == "weekly" else 1)
        if reminder.repeat == "weekdays" and day.weekday() >= 5:
            continue
        # A wall time that does not exist that day (a DST gap) resolves forward by the gap.
        due = datetime.combine(day, wall, tzinfo=zone).astimezone(UTC)
        if due > now:
            return due


def message(reminder: Reminder, now: datetime) -> str:
    """What the user gets when a reminder fires."""
    text = f"⏰ Reminder: {reminder.text}"
    if (now - reminder.due_at).total_seconds() > LATE_S:
        due = reminder.due_at.astimezone(ZoneInfo(reminder.timezone))
        text += f"\n(It was due {due:%a %d %b %H:%M} {reminder.timezone}; I could not send it then.)"
    if reminder.repeat:
        text += f"\n(Reminder #{reminder.number} repeats {reminder.repeat}; ask me to cancel it to stop it.)"
    return text
