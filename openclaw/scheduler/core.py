"""The daemon's one APScheduler: an AsyncIOScheduler whose job store is a table in the daemon's own
database (SQLite file, or PostgreSQL by URL), so triggers and their next run times survive a
restart. It keeps only triggers under string keys ("job:12", "reminder:7"); what a key means, and
what runs when it fires, is the caller's (`Fire`). Each due run is handed over with its due time,
coalesced to one when several were missed."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler.executors.base import BaseExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy.engine import URL, make_url

from openclaw.store import normalize_url
from openclaw.store.engine import sqlite_file

log = logging.getLogger(__name__)

TABLE = "scheduler_triggers"  # APScheduler's own table (it creates it): pickled triggers
WAKE_KEY = "wake"
# The scheduler looks at its table at least this often: `openclaw jobs run-now` and reminders
# added by `openclaw skills run` write from another process, which cannot wake this one.
WAKE_S = 30.0
_SYNC_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg"}

# Runs one due firing: the key and the due time (aware UTC); also WAKE_KEY every WAKE_S.
Fire = Callable[[str, datetime], Awaitable[None]]


def sync_url(url: str | URL) -> URL:
    """Where the triggers are kept, by a synchronous driver (APScheduler 3's SQLAlchemy job store
    is synchronous): PostgreSQL's same database (psycopg 3 needed); for a SQLite store, a file
    beside it ("openclaw.db" -> "openclaw-scheduler.db"). Not the store's own file: the job store
    writes from the event loop's thread, and a write of it waiting for SQLite's one write lock,
    held by a store transaction that needs the loop to go on, deadlocked until the busy timeout.
    An in-memory store gets in-memory triggers, and so does PostgreSQL without psycopg."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend not in _SYNC_DRIVERS:
        raise ValueError(f"the scheduler cannot keep its triggers in a {backend} database")
    if backend == "postgresql":
        if importlib.util.find_spec("psycopg") is None:  # not a dependency of ours
            log.warning("the scheduler keeps its triggers in memory: install psycopg (pip install "
                        "'psycopg[binary]') to keep them in PostgreSQL; until then a run missed "
                        "while the daemon is down is not made up for")
            return make_url("sqlite://")
        return parsed.set(drivername=_SYNC_DRIVERS[backend])
    path = sqlite_file(normalize_url(parsed))
    if path is None:
        return make_url("sqlite://")
    beside = path.with_name(f"{path.stem}-scheduler{path.suffix}")
    with contextlib.suppress(FileExistsError):  # the owner's alone, as the store's file
        os.close(os.open(beside, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return make_url(f"sqlite:///{beside}")


def never_called(*_args: Any) -> None:
    """The function APScheduler stores for each job (it needs an importable one); FiringExecutor
    hands the run to the JobScheduler's `Fire` instead, with its due time."""
    raise RuntimeError("scheduler jobs are run by openclaw.scheduler.core.FiringExecutor")


class FiringExecutor(BaseExecutor):
    """Runs each due job as a task on the event loop: `fire(key, due)`. Unlike APScheduler's own
    executors it passes the due time, which the run's record is unique on, and leaves the misfire
    decision (per kind of job) to the caller."""

    def __init__(self, fire: Fire, running: set[asyncio.Task]) -> None:
        super().__init__()
        self._fire, self._running = fire, running

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        due = run_times[-1].astimezone(UTC)  # coalesced: several missed times run once, the last
        task = asyncio.get_running_loop().create_task(self._fire(job.id, due),
                                                      name=f"scheduled {job.id}")
        self._running.add(task)

        def done(finished: asyncio.Task) -> None:
            self._running.discard(finished)
            self._run_job_success(job.id, [])  # frees its instance slot (max_instances)

        task.add_done_callback(done)


class JobScheduler:
    def __init__(self, url: str | URL) -> None:
        self.url = sync_url(url)
        self._scheduler: AsyncIOScheduler | None = None
        self._running: set[asyncio.Task] = set()

    async def start(self, fire: Fire) -> None:
        """Start firing: what fell due while stopped fires now (once per key, coalesced)."""
        async def guarded(key: str, due: datetime) -> None:
            try:
                await fire(key, due)
            except Exception:
                log.exception("scheduled %s (due %s) failed", key, due.isoformat())

        options: dict[str, Any] = {"pool_pre_ping": True}
        if self.url.get_backend_name() == "sqlite":  # waits on the store's writes, as it does
            options["connect_args"] = {"timeout": 10}
        store = SQLAlchemyJobStore(url=self.url, tablename=TABLE, engine_options=options)
        scheduler = AsyncIOScheduler(
            jobstores={"default": store, "memory": MemoryJobStore()},
            executors={"default": FiringExecutor(guarded, self._running)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=UTC)
        # Creates its table on first use: blocking I/O, once.
        await asyncio.to_thread(store.jobs_t.create, store.engine, checkfirst=True)
        scheduler.add_job(never_called, IntervalTrigger(seconds=WAKE_S), id=WAKE_KEY,
                          jobstore="memory")
        # Its INFO lines ("Added job", "Removed job" at every firing) would fill the journal.
        logging.getLogger("apscheduler").setLevel(max(logging.WARNING, log.getEffectiveLevel()))
        scheduler.start()
        self._scheduler = scheduler

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def put(self, key: str, trigger: BaseTrigger) -> datetime | None:
        """Schedule `key` on `trigger`, keeping its next run time (a missed one too) when it has
        this trigger already, so a restart's reconcile loses no due run; its next run time."""
        job = self._scheduler.get_job(key)
        if job is not None and repr(job.trigger) == repr(trigger):
            return job.next_run_time
        job = self._scheduler.add_job(never_called, trigger, id=key, name=key,
                                      replace_existing=True)
        return getattr(job, "next_run_time", None)

    def remove(self, key: str) -> None:
        with contextlib.suppress(JobLookupError):
            self._scheduler.remove_job(key)

    def next_run(self, key: str) -> datetime | None:
        job = self._scheduler.get_job(key) if self._scheduler else None
        return None if job is None else job.next_run_time

    def keys(self, prefix: str = "") -> list[str]:
        return [job.id for job in self._scheduler.get_jobs(jobstore="default")
                if job.id.startswith(prefix)]

    def wake(self) -> None:
        """Read the table now (what another process changed), not at the next WAKE_S."""
        if self._scheduler is not None:
            self._scheduler.wakeup()

    def run_soon(self, key: str) -> bool:
        """Fire `key` now, then on its trigger as before; whether it is scheduled here."""
        job = self._scheduler.get_job(key)
        if job is None:
            return False
        job.modify(next_run_time=datetime.now(UTC))
        return True

    async def stop(self, drain_timeout: float = 30.0) -> None:
        """Fire nothing more; wait up to `drain_timeout` for runs in progress, then cancel them
        (a cancelled run stays recorded as started: it is not run again)."""
        if self._scheduler is None:
            return
        self._scheduler.shutdown(wait=False)
        self._scheduler = None
        if self._running:
            _, late = await asyncio.wait(set(self._running), timeout=drain_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)


def next_run_elsewhere(url: str | URL, key: str) -> datetime | None:
    """From another process: `key`'s next run time as the daemon's table has it."""
    return _from_elsewhere(url, key, None)


def touch_from_elsewhere(url: str | URL, key: str, when: datetime | None = None) -> bool:
    """From another process (the CLI): make `key` due at `when` (default now) in the daemon's
    table, which the daemon reads within WAKE_S; whether there was such a key."""
    return _from_elsewhere(url, key, when or datetime.now(UTC)) is not None


def _from_elsewhere(url: str | URL, key: str, due: datetime | None) -> datetime | None:
    """`key`'s next run time in the table, first moved to `due` if given; None: no such key.
    The job store alone, never started as a scheduler here: nothing fires in this process."""
    from apscheduler.schedulers.background import BackgroundScheduler

    store = SQLAlchemyJobStore(url=sync_url(url), tablename=TABLE)
    store.start(BackgroundScheduler(timezone=UTC), "default")  # only to rebuild the jobs it reads
    try:
        job = store.lookup_job(key)
        if job is None:
            return None
        if due is not None:
            job.next_run_time = due
            store.update_job(job)
        return job.next_run_time
    finally:
        store.shutdown()
