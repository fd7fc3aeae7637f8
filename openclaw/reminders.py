"""Reminders: the book the `reminders` skill writes into (the store), and the loop that hands each
reminder to the gateway when it is due. The store is the only truth: a reminder is active until a
delivery is recorded, so one that falls due while the daemon is down is sent at the next start
(saying it is late), and a repeating one then moves to its next time still ahead."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

from openclaw.store import Reminder, Store

log = logging.getLogger(__name__)

MAX_ACTIVE = 100  # per user: a runaway model loop must not fill the table
POLL_S = 60.0  # look again at least this often: the wall clock can jump (NTP, suspend), and
# `openclaw skills run` may add reminders from another process
LATE_S = 120  # a delivery later than this says so
REPEATS = ("daily", "weekdays", "weekly")

# Hands one due reminder to whoever sends it: True once it was handled (sent, or dropped because
# its user is no longer allowed), False to try again later (its channel is not running).
Deliver = Callable[[Reminder], Awaitable[bool]]


class Reminders:
    def __init__(self, store: Store, *, max_active: int = MAX_ACTIVE, poll_s: float = POLL_S) -> None:
        self.store, self.max_active, self.poll_s = store, max_active, poll_s
        self._wake = asyncio.Event()
        # Set (and replaced) by retry_now: what a due reminder held back for want of its channel
        # waits on, up to poll_s.
        self._retry = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._in_flight: dict[int, asyncio.Task] = {}

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
        self._wake.set()
        return reminder

    async def pending(self, user: str) -> list[Reminder]:
        return await self.store.active_reminders(user)

    async def cancel(self, user: str, number: int) -> Reminder | None:
        """Cancel by the number the user sees (theirs alone), not the internal id."""
        return await self.store.cancel_reminder(user, number)

    def retry_now(self) -> None:
        """A channel is back (a console attached, a service reachable again): the due reminders
        held back meanwhile are tried at once, not at the end of their poll_s wait."""
        self._retry.set()
        self._retry = asyncio.Event()

    # ---- the loop -----------------------------------------------------------------------------

    def start(self, deliver: Deliver) -> None:
        self._task = asyncio.create_task(self._run(deliver), name="reminders")

    async def stop(self) -> None:
        """Stop delivering; what is not yet recorded as delivered stays due for the next start."""
        tasks = [t for t in (self._task, *self._in_flight.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    async def _run(self, deliver: Deliver) -> None:
        while True:
            self._wake.clear()
            try:
                for reminder in await self.store.active_reminders(due_by=self.now(),
                                                                  exclude=self._in_flight):
                    self._in_flight[reminder.id] = asyncio.create_task(
                        self._deliver(deliver, reminder), name=f"reminder id {reminder.id}")
                upcoming = await self.store.active_reminders(exclude=self._in_flight, limit=1)
            except Exception:  # the database went away for a moment: look again later
                log.exception("reading due reminders failed")
                upcoming = []
            delay = self.poll_s
            if upcoming:
                delay = min(max((upcoming[0].due_at - self.now()).total_seconds(), 0.0), delay)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancel that arrives
            # as the event is set (a reminder added just before stop()), and stop() then hangs.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _deliver(self, deliver: Deliver, reminder: Reminder) -> None:
        try:
            try:
                handled = await deliver(reminder)
            except Exception:
                log.exception("delivering reminder id %d failed", reminder.id)
                handled = False
            if not handled:  # it stays due: held back until the next poll (or retry_now), not
                # tried in a tight loop
                retry = self._retry
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_s):
                        await retry.wait()
        finally:  # also when the gateway dropped it (draining) and cancelled what we waited on
            self._in_flight.pop(reminder.id, None)
            self._wake.set()


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
