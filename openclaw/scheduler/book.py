"""The jobs users keep: add (once, cron or interval; a reminder or an agent job), list, pause,
resume, cancel, each on the user's own jobs only (their key is in every query, and a job is found
by the number they see). The jobs table is the truth; the scheduler's triggers follow it (`sync`).
Without a running scheduler (a CLI process) the table changes alone, and the daemon's next sync
takes them up."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from openclaw.scheduler.core import JobScheduler
from openclaw.scheduler.triggers import Schedule, ScheduleError, parse_schedule, trigger_for
from openclaw.store import Job, JobKind, JobStatus, Store
from openclaw.store.jobs import LIVE

log = logging.getLogger(__name__)

MAX_LIVE = 50  # per user, active and paused: a model in a loop must not fill the table
MAX_TEXT_CHARS = 4000
KEY_PREFIX = "job:"


class JobLimit(ValueError):
    """The user has MAX_LIVE jobs already."""


@dataclass(frozen=True, slots=True)
class Listed:
    job: Job
    next_run: datetime | None  # None: paused, done, or not scheduled in this process


def key_of(job: Job | int) -> str:
    return f"{KEY_PREFIX}{job if isinstance(job, int) else job.id}"


class Jobs:
    def __init__(self, store: Store, scheduler: JobScheduler | None = None, *,
                 max_live: int = MAX_LIVE) -> None:
        self.store, self.scheduler, self.max_live = store, scheduler, max_live

    def now(self) -> datetime:
        return self.store.now()

    def read(self, schedule: str, timezone: str) -> Schedule:
        """`schedule` read in `timezone`; ScheduleError (a ValueError) saying how to write it."""
        return parse_schedule(schedule, ZoneInfo(timezone), self.now())

    async def add(self, user: str, chat_id: str, *, kind: JobKind | str, schedule: str, text: str,
                  timezone: str, options: dict[str, Any] | None = None,
                  config_name: str | None = None) -> Job:
        """A new job of `user`'s, delivered in `chat_id`; ValueError (ScheduleError, JobLimit, or
        a bad kind or text) when it cannot be, with nothing stored."""
        try:
            kind = JobKind(kind)
        except ValueError:
            raise ValueError(f"kind must be one of {[k.value for k in JobKind]}, not {kind!r}") from None
        text = text.strip()
        if not text and kind != JobKind.HEARTBEAT:
            raise ValueError("a job needs its text: what to remind of, or the agent's prompt")
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"the text is {len(text)} characters; at most {MAX_TEXT_CHARS}")
        parsed = self.read(schedule, timezone)
        job = await self.store.add_job(user, chat_id, kind, parsed.spec, text, timezone=timezone,
                                       options=options, config_name=config_name,
                                       max_live=None if config_name else self.max_live)
        if job is None:
            raise JobLimit(f"you have {self.max_live} jobs already; cancel some first")
        self._schedule(job)
        return job

    async def list_for(self, user: str) -> list[Listed]:
        """The user's active and paused jobs, by number, with their next run times."""
        return [Listed(job, self.next_run(job)) for job in await self.store.list_jobs(user)]

    def next_run(self, job: Job) -> datetime | None:
        if job.status != JobStatus.ACTIVE or self.scheduler is None or not self.scheduler.running:
            return None
        return self.scheduler.next_run(key_of(job))

    async def pause(self, user: str, number: int) -> Job | None:
        job = await self._set(user, number, JobStatus.PAUSED, (JobStatus.ACTIVE,))
        if job is not None:
            self._unschedule(job)
        return job

    async def resume(self, user: str, number: int) -> Job | None:
        job = await self._set(user, number, JobStatus.ACTIVE, (JobStatus.PAUSED,))
        if job is not None:
            self._schedule(job)
        return job

    async def cancel(self, user: str, number: int) -> Job | None:
        """Cancel the user's own job numbered `number`; None when they have none by it;
        ValueError for one the config's [[jobs]] sets (the owner's to change)."""
        job = await self._set(user, number, JobStatus.CANCELLED, LIVE)
        if job is not None:
            self._unschedule(job)
        return job

    async def _set(self, user: str, number: int, status: JobStatus,
                   was: tuple[JobStatus, ...]) -> Job | None:
        job = await self.store.set_job_status(user, number, status, was=was)
        if job is None and (found := await self.find(user, number)) and found.config_name:
            raise ValueError(f"job #{number} is set by the owner in the config ([[jobs]]); "
                             "ask them to change it")
        return job

    async def find(self, user: str, number: int) -> Job | None:
        return next((j for j in await self.store.list_jobs(user) if j.number == number), None)

    async def sync(self) -> None:
        """Make the scheduler's triggers follow the table: each active job scheduled (its
        missed run kept), every other job's trigger removed."""
        if self.scheduler is None or not self.scheduler.running:
            return
        active = await self.store.list_jobs(statuses=(JobStatus.ACTIVE,))
        wanted = {key_of(job) for job in active}
        for key in self.scheduler.keys(KEY_PREFIX):
            if key not in wanted:
                self.scheduler.remove(key)
        for job in active:
            self._schedule(job)

    def reschedule(self, job: Job) -> None:
        """Its trigger as its (changed) row says: replaced if it differs, kept if not."""
        self._schedule(job)

    def unschedule(self, job: Job) -> None:
        self._unschedule(job)

    def _schedule(self, job: Job) -> None:
        if self.scheduler is None or not self.scheduler.running or job.status != JobStatus.ACTIVE:
            return
        try:
            trigger = trigger_for(job.schedule, ZoneInfo(job.timezone), job.created_at)
        except (ScheduleError, ValueError, KeyError) as exc:  # a row this version cannot read
            log.warning("job id %d has a schedule that cannot be read (%s): not scheduled",
                        job.id, exc)
            return
        self.scheduler.put(key_of(job), trigger)

    def _unschedule(self, job: Job) -> None:
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.remove(key_of(job))
