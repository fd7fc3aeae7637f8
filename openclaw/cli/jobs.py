"""`openclaw jobs ...`: every user's scheduled jobs, for the admin: list them with their next run
times, cancel one, or make one due now (`run-now`). They write the store and the scheduler's
trigger table, so they work while the daemon runs: it reads both again within half a minute
(openclaw.scheduler.core.WAKE_S), and a job's status again when it fires."""

from __future__ import annotations

import argparse
import sys
from zoneinfo import ZoneInfo

from openclaw.cli.common import with_store
from openclaw.config import load_config
from openclaw.gateway import access
from openclaw.scheduler.book import key_of
from openclaw.scheduler.core import WAKE_S, next_run_elsewhere, touch_from_elsewhere
from openclaw.store import JobStatus
from skills.base import MAX_REMINDER_NUMBER, visible

TEXT_SHOWN = 60


def add_commands(sub, common_sub) -> None:
    jobs = sub.add_parser("jobs", help="everyone's scheduled jobs; cancel one, run one now")
    jobs.add_argument("--user", help='only this user\'s, e.g. "telegram:1001"')
    jobs.set_defaults(func=cmd_list)
    actions = common_sub(jobs.add_subparsers(dest="jobs_cmd"))
    p = actions.add_parser("list", help="active and paused jobs, by user and number")
    p.add_argument("--user", default=argparse.SUPPRESS, help='only this user\'s')
    p.set_defaults(func=cmd_list)
    for name, func, text in (("cancel", cmd_cancel, "cancel USER's job NUMBER"),
                             ("run-now", cmd_run_now, "run USER's job NUMBER now, once")):
        p = actions.add_parser(name, help=text)
        p.add_argument("user", help='"channel:id", e.g. "telegram:1001"')
        p.add_argument("number", type=_number, help="the number its user sees: 3 or #3")
        p.set_defaults(func=func)


def _number(value: str) -> int:
    try:
        number = int(value.removeprefix("#"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job's number (3, or #3)") from None
    if not 0 < number <= MAX_REMINDER_NUMBER:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job's number (they count from 1)")
    return number


def cmd_list(args: argparse.Namespace) -> int:
    try:
        user = access.check_user(args.user) if args.user else None
    except ValueError as exc:
        print(f"openclaw jobs list: {exc}", file=sys.stderr)
        return 2
    jobs = with_store(args, lambda store: store.list_jobs(user), none_yet=[])
    if not jobs:
        print("no scheduled jobs")
        return 0
    url = load_config(args.config, tokens=False).store.url
    for job in jobs:
        after = next_run_elsewhere(url, key_of(job)) if job.status == JobStatus.ACTIVE else None
        when = (f"next {after.astimezone(ZoneInfo(job.timezone)):%Y-%m-%d %H:%M} {job.timezone}"
                if after else str(job.status))
        text = visible(job.text)
        text = text if len(text) <= TEXT_SHOWN else text[:TEXT_SHOWN - 3] + "..."
        owner = f" [[jobs]] {job.config_name}" if job.config_name else ""
        print(f"{job.user:<24} #{job.number:<4} {job.kind:<9} {job.schedule:<24} {when}  "
              f"chat {job.channel}:{job.chat_id}{owner}  {text}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    found = _find(args, "cancel")
    if found is None:
        return 1
    user = found.user

    async def cancel(store):  # the owner's too: the admin is the owner (the config adds it
        # back at the next reload if it is still in [[jobs]])
        return await store.update_job(found.id, status=JobStatus.CANCELLED)

    with_store(args, cancel)
    print(f"cancelled {user}'s job #{found.number}: {visible(found.text)}")
    return 0


def cmd_run_now(args: argparse.Namespace) -> int:
    found = _find(args, "run-now")
    if found is None:
        return 1
    if found.status != JobStatus.ACTIVE:
        print(f"openclaw jobs run-now: {found.user}'s job #{found.number} is {found.status}; "
              "resume it first", file=sys.stderr)
        return 1
    url = load_config(args.config, tokens=False).store.url
    if not touch_from_elsewhere(url, key_of(found)):
        print(f"openclaw jobs run-now: job #{found.number} has no trigger yet: start the daemon, "
              "which schedules it", file=sys.stderr)
        return 1
    print(f"{found.user}'s job #{found.number} is due now: the running daemon runs it within "
          f"{WAKE_S:.0f} s, or at its next start")
    return 0


def _find(args: argparse.Namespace, command: str):
    try:
        user = access.check_user(args.user)
    except ValueError as exc:
        print(f"openclaw jobs {command}: {exc}", file=sys.stderr)
        return None
    jobs = with_store(args, lambda store: store.list_jobs(user), none_yet=[])
    found = next((job for job in jobs if job.number == args.number), None)
    if found is None:
        print(f"openclaw jobs {command}: {user} has no active or paused job #{args.number} "
              "(see openclaw jobs list)", file=sys.stderr)
    return found



