"""One firing of a job, for one due time: late beyond its kind's grace, the user is told it was
missed; within it, it runs once. The run is recorded (job id + due time, unique) before it starts,
so no due time runs twice, also across a crash in the middle of the run (that run is then marked
interrupted at the next start, not repeated). A reminder's text is queued for sending in the same
transaction as its record; an agent job's or heartbeat's answer when the run ends."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from openclaw.store import Job, JobKind, JobRun, JobStatus, OutboundMessage, Store

log = logging.getLogger(__name__)

# How late a run may still start, per kind: a reminder is still worth having a day late (it says
# it is late); an agent job's "what matters in my inbox" is stale after a quarter of an hour; a
# heartbeat is only about now.
GRACE = {JobKind.REMINDER: timedelta(hours=24), JobKind.AGENT: timedelta(minutes=15),
         JobKind.HEARTBEAT: timedelta(minutes=5)}
LATE = timedelta(minutes=2)  # a reminder later than this says when it was due

# Runs an agent job or a heartbeat: the text to deliver, or None to stay silent.
Runner = Callable[[Job], Awaitable[str | None]]


class Delivery(Protocol):
    """Where a job's text goes: cut for its channel, and sent through the outbox."""

    def pieces(self, channel: str, text: str) -> list[str]: ...

    async def send(self, channel: str, chat_id: str, stored: list[OutboundMessage]) -> None: ...


class JobRuns:
    def __init__(self, store: Store, delivery: Delivery,
                 runners: dict[JobKind, Runner] | None = None) -> None:
        self.store, self.delivery = store, delivery
        self.runners: dict[JobKind, Runner] = dict(runners or {})

    async def fire(self, job_id: int, due: datetime) -> str:
        """Run `job_id` for `due`; what happened: "delivered", "silent", "missed", "failed",
        "skipped" (not active, or this due time has run already)."""
        job = await self.store.get_job(job_id)
        if job is None or job.status != JobStatus.ACTIVE:
            return "skipped"
        once = job.schedule.startswith("once ")
        late = self.store.now() - due
        if late > GRACE[job.kind]:
            return await self._missed(job, due, once)
        if job.kind == JobKind.REMINDER:
            text = reminder_text(job, due, late)
            started = await self.store.start_job_run(job.id, due, outcome="delivered", done=once,
                                                     pieces=self.delivery.pieces(job.channel, text))
            if started is None:
                return "skipped"
            await self.delivery.send(job.channel, job.chat_id, started[1])
            return "delivered"
        started = await self.store.start_job_run(job.id, due, done=once)
        if started is None:
            return "skipped"
        run, _ = started
        runner = self.runners.get(job.kind)
        try:
            if runner is None:
                raise RuntimeError(f"no runner for {job.kind} jobs in this daemon")
            answer = await runner(job)
        except Exception as exc:
            log.exception("job id %d (due %s) failed", job.id, due.isoformat())
            stored = await self.store.finish_job_run(run.id, "failed", self.delivery.pieces(
                job.channel, f"Your scheduled job #{job.number} failed: {type(exc).__name__}."))
            await self.delivery.send(job.channel, job.chat_id, stored)
            return "failed"
        if not answer:
            await self.store.finish_job_run(run.id, "silent")
            return "silent"
        stored = await self.store.finish_job_run(run.id, "delivered",
                                                 self.delivery.pieces(job.channel, answer))
        await self.delivery.send(job.channel, job.chat_id, stored)
        return "delivered"

    async def interrupted(self, run: JobRun) -> None:
        """Tell the user a run a stop cut short is not run again (a crash, a kill)."""
        job = await self.store.get_job(run.job_id)
        if job is None or job.kind == JobKind.HEARTBEAT:
            return
        when = run.due_at.astimezone(ZoneInfo(job.timezone))
        stored = await self.store.add_reply(job.channel, job.chat_id, self.delivery.pieces(
            job.channel, f"Your scheduled job #{job.number} (due {when:%a %d %b %H:%M} "
                         f"{job.timezone}) was cut short by a restart; I do not run it again for "
                         "that time, in case it had already done something."))
        await self.delivery.send(job.channel, job.chat_id, stored)

    async def _missed(self, job: Job, due: datetime, once: bool) -> str:
        """Past its grace: recorded as missed, and the user told (a heartbeat says nothing: the
        next one looks at the checklist again)."""
        pieces = None
        if job.kind != JobKind.HEARTBEAT:
            when = due.astimezone(ZoneInfo(job.timezone))
            pieces = self.delivery.pieces(job.channel, (
                f"I missed your scheduled job #{job.number}, due {when:%a %d %b %H:%M} "
                f"{job.timezone}: I was not running then." + (
                    "" if once else " It runs again at its next time.")))
        started = await self.store.start_job_run(job.id, due, outcome="missed", done=once,
                                                 pieces=pieces or [])
        if started is None:
            return "skipped"
        if pieces:
            await self.delivery.send(job.channel, job.chat_id, started[1])
        return "missed"


def reminder_text(job: Job, due: datetime, late: timedelta) -> str:
    text = f"⏰ Reminder: {job.text}"
    if late > LATE:
        when = due.astimezone(ZoneInfo(job.timezone))
        text += f"\n(It was due {when:%a %d %b %H:%M} {job.timezone}; I could not send it then.)"
    return text
