"""`schedule`: the user's own scheduled jobs. A job runs once (`when`: the user's own words, "in 20
minutes", "tomorrow 9:00"), on a cron expression (`cron`: five fields or @daily, @hourly...) or
every so often (`every`: "30m", "2 hours"), in the user's zone; it reminds the user of a text
(kind "reminder") or runs a prompt as an agent turn and delivers the answer (kind "agent"; with
only_if_attention, only when something needs the user). list, pause, resume and cancel work on the
user's own jobs by the number the list shows; the daemon keeps and fires them (the context's
JobBook), and every call acts for the calling user only: there is no argument naming another."""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import ZoneInfo

from skills.base import MAX_REMINDER_NUMBER, JobBook, Skill, SkillContext, SkillError, visible
from skills.builtin.spoken_time import WHEN_HELP, local_time, parse_when
from skills.zones import TIMEZONE_PARAMETER, timezone_setting_problems
from skills.zones import zone_name as zone_name_of

WHEN_KEYS = ("when", "cron", "every")
JOBS_USAGE = ("/jobs lists your scheduled jobs; /jobs cancel N cancels one, /jobs pause N and "
              "/jobs resume N pause and resume one, N as the list numbers it.")


class ScheduleSkill(Skill):
    name = "schedule"
    description = ("Schedule work for the user, in this chat: a reminder or an agent task (a "
                   "prompt you run then, answering the user), once (when), on a cron expression "
                   "(cron) or at an interval (every); list the user's jobs, pause, resume or "
                   "cancel one by its number.")
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "list", "pause", "resume", "cancel"]},
            "kind": {"type": "string", "enum": ["reminder", "agent"],
                     "description": "add: remind of text, or run text as a task (default reminder)"},
            "text": {"type": "string", "description": "add: the reminder's text, or the task"},
            "when": {"type": "string", "description": "add, once: the user's own words for the "
                                                      "time: " + WHEN_HELP.removeprefix("use ")},
            "cron": {"type": "string", "description": "add, repeating: five cron fields "
                                                      "('0 8 * * 1-5') or @hourly/@daily/@weekly"},
            "every": {"type": "string", "description": "add, repeating: an interval ('30m', '2h')"},
            "only_if_attention": {"type": "boolean",
                                  "description": "add, agent: tell the user only when something "
                                                 "needs them"},
            "number": {"type": "integer", "description": "pause/resume/cancel: the job's number"},
            "timezone": TIMEZONE_PARAMETER,
        },
        "required": ["action"],
        # No argument names a user: a call acts for its caller. One more (a "user" the model
        # made up) is an error, not silently ignored.
        "additionalProperties": False,
    }
    read_only_actions = frozenset({"list"})
    untrusted_output = False

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        return timezone_setting_problems(cls.name, settings)

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        book = ctx.jobs
        if book is None:
            raise SkillError("scheduled jobs need the running daemon, which runs them")
        action = args["action"]
        if action == "list":
            return await _list(book, ctx)
        if action == "add":
            return await _add(book, args, ctx)
        number = args.get("number")
        if not isinstance(number, int) or not 0 < number <= MAX_REMINDER_NUMBER:
            raise SkillError(f"{action} needs the job's number (list shows them)")
        change = {"pause": book.pause, "resume": book.resume, "cancel": book.cancel}[action]
        try:
            job = await change(ctx.user, number)
        except ValueError as exc:  # one the owner set in the config
            raise SkillError(str(exc)) from None
        if job is None:
            state = {"pause": "active", "resume": "paused", "cancel": "active or paused"}[action]
            raise SkillError(f"you have no {state} job #{number}; list shows them")
        done = {"pause": "Paused", "resume": "Resumed", "cancel": "Cancelled"}[action]
        return f"{done} job #{job.number}."

    def typed_command(self, command: str, argument: str) -> dict[str, Any] | str:
        """`/jobs` (the list) and `/jobs cancel|pause|resume N` as this skill's call; or how to
        write them."""
        change = re.fullmatch(r"(cancel|pause|resume)\s+#?(\d+)", argument.strip(), re.IGNORECASE)
        if change is None and argument.strip():
            return JOBS_USAGE
        return {"action": change[1].lower(), "number": int(change[2])} if change else {"action": "list"}

    def describe(self, args: dict[str, Any]) -> str:
        if args.get("action") != "add":
            return super().describe(args)
        when = next((f"{key} {args[key]}" for key in WHEN_KEYS if args.get(key)), "?")
        return (f"schedule a {visible(str(args.get('kind') or 'reminder'))} ({visible(when)}): "
                f"{visible(str(args.get('text', '')))}")


async def _add(book: JobBook, args: dict[str, Any], ctx: SkillContext) -> str:
    if not ctx.chat_id:
        raise SkillError("a job needs a chat to deliver to, and this call has none")
    given = [key for key in WHEN_KEYS if args.get(key)]
    if len(given) != 1:
        raise SkillError("add needs exactly one of when (once), cron or every; "
                         f"got {', '.join(given) or 'none'}")
    zone_name = zone_name_of(args, ctx.settings)
    zone = ZoneInfo(zone_name)
    key, value = given[0], str(args[given[0]])
    if key == "when":  # the user's words read here, said back exactly below
        schedule = "once " + parse_when(value, book.now(), zone).isoformat()
    else:
        schedule = f"cron {value}" if key == "cron" else f"every {value}"
    kind = args.get("kind") or "reminder"
    options = {"only_if_attention": True} if args.get("only_if_attention") else None
    try:
        job = await book.add(ctx.user, ctx.chat_id, kind=kind, schedule=schedule,
                             text=str(args.get("text") or ""), timezone=zone_name, options=options)
    except ValueError as exc:  # a bad cron, interval or text; the cap
        raise SkillError(str(exc)) from None
    listed = next((item for item in await book.list_for(ctx.user) if item.job.id == job.id), None)
    first = (f"; first run {local_time(listed.next_run, zone)} {zone_name}"
             if listed is not None and listed.next_run else "")
    return f"Job #{job.number} ({job.kind}) scheduled: {_shown(job.schedule)}{first}: {job.text}"


async def _list(book: JobBook, ctx: SkillContext) -> str:
    """The user's jobs (theirs alone: the book is asked for this user's only)."""
    zone_name = zone_name_of({}, ctx.settings)
    listed = await book.list_for(ctx.user)
    if not listed:
        return "You have no scheduled jobs."
    return "\n".join(line(item, ZoneInfo(zone_name)) for item in listed)


def line(item: Any, zone: ZoneInfo) -> str:
    """One job as /jobs and the list show it, with its next run in the user's zone."""
    job = item.job
    when = (f"next {local_time(item.next_run, zone)} {zone.key}" if item.next_run
            else str(job.status))
    text = job.text if len(job.text) <= 80 else job.text[:79] + "…"
    return f"#{job.number} {job.kind}, {_shown(job.schedule)}, {when}: {text}"


def _shown(spec: str) -> str:
    kind, _, value = spec.partition(" ")
    if kind == "every":
        seconds = int(value.removesuffix("s"))
        return f"every {seconds // 60} min" if seconds % 3600 else f"every {seconds // 3600} h"
    return f"cron '{value}'" if kind == "cron" else "once"
