"""`[[jobs]]`: scheduled jobs the admin sets for a user in the config (a morning briefing, a
build check), reconciled with the jobs table at start and on reload (openclaw.scheduler.config_jobs):
added, changed or removed there as here, never twice (each is kept under its `name`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal
from zoneinfo import ZoneInfo

from pydantic import AfterValidator, field_validator

from openclaw.config.fields import Section
from openclaw.scheduler.triggers import ScheduleError, parse_schedule
from skills.zones import zone


class JobConfig(Section):
    """One `[[jobs]]` entry."""

    user: str
    """Whose job it is ("telegram:1001"): it runs with that user's role, in their chat."""
    schedule: str
    """A cron expression ("0 8 * * 1-5", "@daily") or an interval ("every 30m"), in `timezone`."""
    prompt: str
    """What the agent is asked (kind "agent"), or the reminder's text (kind "reminder")."""
    kind: Literal["agent", "reminder"] = "agent"
    name: str | None = None
    """What identifies the job across edits of this file (default: the user and the prompt, so
    an edited prompt is a new job); unique among [[jobs]]."""
    chat: str | None = None
    """The chat it runs and answers in (default: the user's private chat)."""
    timezone: str | None = None
    """IANA zone of `schedule` (default: the reminders' and clock's zone, or this machine's)."""
    only_if_attention: bool = False
    """An agent job speaks only when something needs the user."""

    @field_validator("user")
    @classmethod
    def _user_key(cls, value: str) -> str:
        channel, _, external = value.partition(":")
        if not channel or not external:
            raise ValueError(f"{value!r} is not a user; write CHANNEL:ID, e.g. \"telegram:1001\"")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None and zone(value) is None:
            raise ValueError(f"unknown time zone {value!r}; use an IANA name such as 'Europe/Paris'")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        try:
            spec = parse_schedule(value, ZoneInfo("UTC"), datetime.now(UTC)).spec
        except ScheduleError as exc:
            raise ValueError(str(exc)) from None
        if spec.startswith("once "):
            raise ValueError("a [[jobs]] entry repeats: give a cron expression or 'every ...'; "
                             "a one-off belongs in a chat (/remind)")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the prompt is empty")
        return value

    @property
    def key(self) -> str:
        return self.name or f"{self.user}: {self.prompt.strip()[:100]}"


def _one_name_each(jobs: list[JobConfig]) -> list[JobConfig]:
    """Two entries under one name would be one job changed back and forth: refused, each named."""
    seen: dict[str, int] = {}
    problems = []
    for index, job in enumerate(jobs):
        if job.key in seen:
            problems.append(f"jobs[{index}].name: {job.key!r} is also jobs[{seen[job.key]}]'s; "
                            "give each [[jobs]] entry its own name")
        seen.setdefault(job.key, index)
    if problems:
        raise ValueError("\n".join(problems))
    return jobs


JobsList = Annotated[list[JobConfig], AfterValidator(_one_name_each)]
