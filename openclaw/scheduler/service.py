"""The daemon's scheduled work, put together: one JobScheduler on the store's database, with the
reminders and the jobs on it; started after the gateway's recovery, stopped (drained) before the
gateway drains. What fires is handed to the reminders ("reminder:ID") or to the job runs
("job:ID"); every WAKE_S both follow their tables again, for changes made by another process."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from openclaw.config import Config
from openclaw.gateway.outbox import chunk_text
from openclaw.reminders import KEY_PREFIX as REMINDER_KEY
from openclaw.reminders import Reminders
from openclaw.scheduler.book import KEY_PREFIX as JOB_KEY
from openclaw.scheduler.book import Jobs
from openclaw.scheduler.config_jobs import reconcile
from openclaw.scheduler.core import WAKE_KEY, JobScheduler
from openclaw.scheduler.runs import JobRuns, Runner
from openclaw.store import Job, JobKind, OutboundMessage, Store

if TYPE_CHECKING:
    from openclaw.gateway.gateway import Gateway

log = logging.getLogger(__name__)

SKILL = "schedule"  # a user's own jobs stop when this skill is no longer theirs
FALLBACK_LEN = 4000  # a channel not running here: its pieces wait in the outbox for it


class GatewayDelivery:
    """A job's text, cut for its channel and sent through the gateway's outbox (which keeps it
    pending while the channel is away)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def pieces(self, channel: str, text: str) -> list[str]:
        connector = self.gateway.outbox.connectors.get(channel)
        return chunk_text(text, connector.max_message_len if connector else FALLBACK_LEN)

    async def send(self, channel: str, chat_id: str, stored: list[OutboundMessage]) -> None:
        if stored and channel in self.gateway.outbox.connectors:
            await self.gateway.outbox.deliver(channel, chat_id, stored)


class Scheduling:
    def __init__(self, store: Store, url: str) -> None:
        self.store = store
        self.scheduler = JobScheduler(url)
        self.reminders = Reminders(store, self.scheduler)
        self.jobs = Jobs(store, self.scheduler)
        self.runs: JobRuns | None = None
        self.gateway: Gateway | None = None

    async def start(self, gateway: Gateway, config: Config | None = None,
                    runners: dict[JobKind, Runner] | None = None) -> None:
        """Fire from now on: what fell due while down fires now (late, or missed, by its kind's
        grace); a run a crash cut short is marked interrupted and not run again. `config`'s
        [[jobs]] are reconciled first."""
        self.gateway = gateway
        self.runs = JobRuns(self.store, GatewayDelivery(gateway),
                            agent_runners(gateway) if runners is None else runners)
        for run in await self.store.interrupt_job_runs():
            log.warning("job id %d's run due %s was cut short by a stop; it is not run again",
                        run.job_id, run.due_at.isoformat())
            await self.runs.interrupted(run)
        self.reminders.start(gateway.remind)
        await self.scheduler.start(self.fire)
        if config is not None:
            await self.reconcile(config)
        await self.follow_tables()

    async def reconcile(self, config: Config) -> None:
        """[[jobs]] as `config` says them (at start, and after each reload)."""
        try:
            await reconcile(self.jobs, config)
        except Exception:  # the store away for a moment: the next reload tries again
            log.exception("reconciling [[jobs]] with the jobs table failed")

    async def follow_tables(self) -> None:
        await self.jobs.sync()
        await self.reminders.sync()

    async def fire(self, key: str, due: datetime) -> None:
        if key == WAKE_KEY:
            await self.follow_tables()
        elif key.startswith(REMINDER_KEY):
            await self.reminders.fire(int(key.removeprefix(REMINDER_KEY)))
        elif key.startswith(JOB_KEY):
            job = await self.store.get_job(int(key.removeprefix(JOB_KEY)))
            if job is not None and (why_not := await self.why_not(job)):
                log.info("cancelling job id %d: %s", job.id, why_not)
                await self.jobs.cancel(job.user, job.number)
                return
            await self.runs.fire(int(key.removeprefix(JOB_KEY)), due)
        else:
            log.warning("the scheduler fired %s, which is nobody's: removed", key)
            self.scheduler.remove(key)

    async def why_not(self, job: Job) -> str | None:
        """Why `job` may no longer run: its user lost access, or (a job of their own, not the
        config's) the schedule skill is no longer theirs. None when it may."""
        access = self.gateway.access
        if not await access.still_allowed(job.user):
            return f"{job.user} is no longer allowed"
        if job.config_name is not None or job.kind == JobKind.HEARTBEAT:  # set by /heartbeat
            return None
        try:
            role = access.role(job.user)
        except Exception as exc:  # a role the config no longer has
            return str(exc)
        if SKILL not in self.gateway.agent.executor.registry.names or not role.grants(SKILL):
            return f"{job.user} may no longer use the {SKILL} skill"
        return None

    async def stop(self, drain_timeout: float = 30.0) -> None:
        await self.reminders.stop()
        await self.scheduler.stop(drain_timeout)


def agent_runners(gateway: Gateway) -> dict[JobKind, Runner]:
    """The runners of the kinds that call the model: agent jobs (and heartbeats, once wired)."""
    from openclaw.scheduler.agent_job import AgentJobRequest, AgentJobs

    agent_jobs = AgentJobs(gateway)

    async def agent(job: Job) -> str | None:
        return await agent_jobs.run(AgentJobRequest(
            user=job.user, channel=job.channel, chat_id=job.chat_id, prompt=job.text,
            only_if_attention=bool((job.options or {}).get("only_if_attention")),
            name=f"job #{job.number}"))

    return {JobKind.AGENT: agent}
