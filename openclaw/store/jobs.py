"""Scheduled jobs: what each user asked to run when (kind, schedule, zone, text), numbered per user
as their reminders are; and the record of each run, written before the run starts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import insert_record, to_record
from openclaw.store.journal import JournalStore
from openclaw.store.models import JobRow, JobRunRow
from openclaw.store.records import (
    Job,
    JobKind,
    JobRun,
    JobStatus,
    OutboundMessage,
    parse_user_key,
)

LIVE = (JobStatus.ACTIVE, JobStatus.PAUSED)  # what counts against a user's cap and is listed


class _NoRoom(Exception):
    """Rolls back a job that would take a user past their cap."""


class JobStore(JournalStore):
    """The Store's jobs and job runs (their replies go through the journal's outbox rows)."""

    async def add_job(self, user: str, chat_id: str | int, kind: JobKind | str, schedule: str,
                      text: str, *, timezone: str, options: dict[str, Any] | None = None,
                      config_name: str | None = None, max_live: int | None = None) -> Job | None:
        """A job for `user`, delivered to `chat_id` on their channel; None, and nothing stored,
        when they would have more than `max_live` active or paused ones. It gets the user's next
        number, never given twice (see ReminderStore.add_reminder for how)."""
        channel, _ = parse_user_key(user)
        next_number = (select(func.coalesce(func.max(JobRow.number), 0) + 1)
                       .where(JobRow.user == user).scalar_subquery())

        async def op(session: AsyncSession) -> Job:
            if self.dialect == "postgresql":
                await session.execute(select(func.pg_advisory_xact_lock(func.hashtext(user))))
            now = self.now()
            row = JobRow(number=next_number, user=user, channel=channel, chat_id=str(chat_id),
                         kind=JobKind(kind), schedule=schedule, timezone=timezone, text=text,
                         options=options, status=JobStatus.ACTIVE, config_name=config_name,
                         created_at=now, updated_at=now)
            session.add(row)
            await session.flush()
            await session.refresh(row, ["number"])
            if max_live is not None and await session.scalar(
                    select(func.count()).select_from(JobRow).where(
                        JobRow.user == user, JobRow.status.in_(LIVE))) > max_live:
                raise _NoRoom
            return to_record(Job, row)

        try:
            return await self.retrying(op)
        except _NoRoom:
            return None

    async def get_job(self, job_id: int) -> Job | None:
        async with self.transaction() as session:
            row = await session.get(JobRow, job_id)
            return None if row is None else to_record(Job, row)

    async def list_jobs(self, user: str | None = None, *, statuses: tuple[JobStatus, ...] = LIVE,
                        configured: bool | None = None) -> list[Job]:
        """Jobs in `statuses`, by user and number: one user's or everyone's; `configured`: only
        the [[jobs]] ones (True) or only the users' own (False)."""
        query = select(JobRow).where(JobRow.status.in_(statuses))
        if user is not None:
            query = query.where(JobRow.user == user)
        if configured is not None:
            query = query.where(JobRow.config_name.is_not(None) if configured
                                else JobRow.config_name.is_(None))
        async with self.transaction() as session:
            rows = await session.scalars(query.order_by(JobRow.user, JobRow.number))
            return [to_record(Job, row) for row in rows]

    async def set_job_status(self, user: str, number: int, status: JobStatus,
                             *, was: tuple[JobStatus, ...] = LIVE) -> Job | None:
        """Move the user's own job numbered `number` from one of `was` to `status`; None when
        they have no such job (another user's number finds nothing: the user is in the WHERE), or
        it is a [[jobs]] one (the config's, changed only by reconciling the config)."""
        mine = (JobRow.user == user, JobRow.number == number, JobRow.config_name.is_(None))
        async with self.transaction() as session:
            result = await session.execute(
                update(JobRow).where(*mine, JobRow.status.in_(was))
                .values(status=status, updated_at=self.now())
                .execution_options(synchronize_session=False))
            if result.rowcount != 1:
                return None
            return to_record(Job, await session.scalar(select(JobRow).where(*mine)))

    async def update_job(self, job_id: int, **values: Any) -> Job | None:
        """Change a job's fields (a [[jobs]] entry edited in the config); the job, None if gone."""
        async with self.transaction() as session:
            row = await session.get(JobRow, job_id)
            if row is None:
                return None
            for key, value in values.items():
                setattr(row, key, value)
            row.updated_at = self.now()
            await session.flush()
            return to_record(Job, row)

    async def start_job_run(self, job_id: int, due_at: datetime, *, outcome: str = "running",
                            pieces: list[str] | None = None, done: bool = False
                            ) -> tuple[JobRun, list[OutboundMessage]] | None:
        """Record the run of `job_id` for `due_at` before it starts; None, and nothing stored,
        when that due time already has a run (it must not run twice) or the job is no longer
        active. With `pieces` (a reminder's text) they are queued for the outbox in the same
        transaction, so after a crash they are sent, never sent twice. `done`: a one-off's only
        run, which ends the job."""
        try:
            async with self.transaction() as session:
                row = await session.get(JobRow, job_id)
                if row is None or row.status != JobStatus.ACTIVE:
                    return None
                now = self.now()
                run = await insert_record(session, JobRunRow, JobRun, job_id=job_id, due_at=due_at,
                                          started_at=now, finished_at=now if pieces is not None
                                          else None, outcome=outcome)
                if done:
                    row.status, row.updated_at = JobStatus.DONE, now
                stored = []
                if pieces is not None:
                    stored = await self._add_outbound(session, row.channel, row.chat_id, pieces,
                                                      None, None)
                return run, stored
        except IntegrityError:  # UNIQUE (job_id, due_at): this due time has run already
            return None

    async def finish_job_run(self, run_id: int, outcome: str,
                             pieces: list[str] | None = None) -> list[OutboundMessage]:
        """End a run with its outcome; `pieces` queued for the outbox in the same transaction."""
        async with self.transaction() as session:
            run = await session.get(JobRunRow, run_id)
            run.finished_at, run.outcome = self.now(), outcome
            if not pieces:
                return []
            job = await session.get(JobRow, run.job_id)
            return await self._add_outbound(session, job.channel, job.chat_id, pieces, None, None)

    async def job_runs(self, job_id: int) -> list[JobRun]:
        async with self.transaction() as session:
            rows = await session.scalars(
                select(JobRunRow).where(JobRunRow.job_id == job_id).order_by(JobRunRow.due_at))
            return [to_record(JobRun, row) for row in rows]

    async def interrupt_job_runs(self) -> list[JobRun]:
        """Runs a crash left unfinished, marked "interrupted" (never run again); those marked."""
        async with self.transaction() as session:
            rows = list(await session.scalars(
                select(JobRunRow).where(JobRunRow.finished_at.is_(None))))
            for row in rows:
                row.finished_at, row.outcome = self.now(), "interrupted"
            return [to_record(JobRun, row) for row in rows]
