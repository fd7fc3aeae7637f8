"""`[[jobs]]` reconciled with the jobs table, at start and on every reload: an entry new to the
table is added, one whose user, chat, kind, schedule, zone or prompt changed is changed in place
(same job, same number, its trigger replaced), one gone from the file is cancelled. Each is kept
under its entry's name (unique in the table too), so no start or reload ever adds one twice."""

from __future__ import annotations

import logging
from typing import Any

from openclaw.config import Config
from openclaw.config.jobs import JobConfig
from openclaw.scheduler.book import Jobs
from openclaw.store import JobKind, JobStatus, parse_user_key
from skills.zones import SAME_ZONE, local_zone_name

log = logging.getLogger(__name__)


def default_zone(config: Config) -> str:
    """The zone the clock, reminders and schedule skills share, or this machine's."""
    settings = config.skills.settings
    return next((settings[name]["timezone"] for name in SAME_ZONE
                 if "timezone" in settings.get(name, {})), None) or local_zone_name()


def wanted(entry: JobConfig, zone: str, jobs: Jobs) -> dict[str, Any]:
    """The job row's fields `entry` asks for."""
    _, external_id = parse_user_key(entry.user)
    return {"user": entry.user, "chat_id": entry.chat or external_id, "kind": JobKind(entry.kind),
            "schedule": jobs.read(entry.schedule, zone).spec, "timezone": zone,
            "text": entry.prompt.strip(),
            "options": {"only_if_attention": True} if entry.only_if_attention else None}


async def reconcile(jobs: Jobs, config: Config) -> dict[str, list[str]]:
    """Make the table's config jobs what `config.jobs` says; the names added, changed, removed."""
    store, zone = jobs.store, default_zone(config)
    kept = {job.config_name: job for job in await store.list_jobs(
        statuses=tuple(JobStatus), configured=True)}
    changes: dict[str, list[str]] = {"added": [], "changed": [], "removed": []}
    for entry in config.jobs:
        want = wanted(entry, entry.timezone or zone, jobs)
        job = kept.pop(entry.key, None)
        if job is not None and job.user != want["user"]:  # another user's: a new job (numbers
            # are per user), the old one cancelled and its name freed
            await store.update_job(job.id, status=JobStatus.CANCELLED, config_name=None)
            jobs.unschedule(job)
            job = None
        if job is None:
            await jobs.add(want["user"], want["chat_id"], kind=want["kind"],
                           schedule=want["schedule"], text=want["text"], timezone=want["timezone"],
                           options=want["options"], config_name=entry.key)
            changes["added"].append(entry.key)
        elif job.status != JobStatus.ACTIVE or any(getattr(job, k) != v for k, v in want.items()):
            changed = await store.update_job(job.id, status=JobStatus.ACTIVE,
                                             **{k: v for k, v in want.items() if k != "user"})
            jobs.reschedule(changed)
            changes["changed"].append(entry.key)
    for job in kept.values():
        if job.status in (JobStatus.ACTIVE, JobStatus.PAUSED):
            await store.update_job(job.id, status=JobStatus.CANCELLED)
            jobs.unschedule(job)
            changes["removed"].append(job.config_name)
    if any(changes.values()):
        log.info("[[jobs]]: %s", "; ".join(f"{what} {', '.join(names)}"
                                            for what, names in changes.items() if names))
    return changes
