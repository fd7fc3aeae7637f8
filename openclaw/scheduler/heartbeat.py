"""Heartbeats: per user and opt-in, an agent job over a checklist the user keeps, at an interval,
that speaks only when something on it needs them. The checklist is what `/heartbeat edit TEXT`
stored, else `HEARTBEAT.md` in their workspace; an empty one means no model call at all, and none
runs in the user's quiet hours. `/heartbeat` is the chat command that sets it all."""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import select

from openclaw.gateway.contract import InboundMessage
from openclaw.scheduler.agent_job import AgentJobRequest, AgentJobs
from openclaw.scheduler.book import Jobs
from openclaw.store import Job, JobKind, Store
from openclaw.store.models import HeartbeatRow
from sandbox.grants import open_folder, writable_folders

log = logging.getLogger(__name__)

CHECKLIST_FILE = "HEARTBEAT.md"
CHECKLIST_MAX_BYTES = 16 * 1024  # read at most this much of the file: it goes into a prompt
DEFAULT_EVERY_MIN = 30
EVERY_MIN, EVERY_MAX = 5, 24 * 60  # minutes between runs
PROMPT = ("Heartbeat check. Go through the user's checklist below, using your tools where an item "
          "needs a look, and say what needs their attention now.\n\nChecklist:\n")
USAGE = ("/heartbeat - show your heartbeat; /heartbeat on, /heartbeat off; /heartbeat every 30m "
         "(5m to 24h); /heartbeat edit TEXT - the checklist (no TEXT: use HEARTBEAT.md in your "
         "workspace); /heartbeat quiet 22:00-07:00 [Europe/Paris], /heartbeat quiet off")


@dataclass(frozen=True)
class HeartbeatSettings:
    """A user's heartbeat, as stored (off until they turn it on)."""

    user: str
    enabled: bool
    every_minutes: int
    channel: str  # where it speaks: the chat /heartbeat on was sent in
    chat_id: str
    quiet_start: str | None  # "22:00" in `timezone`; None: no quiet hours
    quiet_end: str | None
    timezone: str
    checklist: str | None  # from /heartbeat edit; None: HEARTBEAT.md

    def quiet_at(self, now: datetime) -> bool:
        """Whether `now` is in the quiet hours (which may span midnight)."""
        if not self.quiet_start or not self.quiet_end:
            return False
        wall = now.astimezone(ZoneInfo(self.timezone)).time()
        start, end = time.fromisoformat(self.quiet_start), time.fromisoformat(self.quiet_end)
        return start <= wall < end if start <= end else wall >= start or wall < end


class HeartbeatStore:
    """The heartbeats table through the store's transactions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self, user: str) -> HeartbeatSettings | None:
        async with self.store.transaction() as session:
            row = await session.scalar(select(HeartbeatRow).where(HeartbeatRow.user == user))
            return _record(row) if row is not None else None

    async def put(self, settings: HeartbeatSettings) -> None:
        async with self.store.transaction() as session:
            row = await session.scalar(select(HeartbeatRow).where(HeartbeatRow.user == settings.user))
            if row is None:
                row = HeartbeatRow(user=settings.user)
                session.add(row)
            for name in ("enabled", "every_minutes", "channel", "chat_id", "quiet_start",
                         "quiet_end", "timezone", "checklist"):
                setattr(row, name, getattr(settings, name))
            row.updated_at = self.store.now()

    async def enabled(self) -> list[HeartbeatSettings]:
        """Every heartbeat that is on: the scheduler's to schedule at start."""
        async with self.store.transaction() as session:
            rows = await session.scalars(select(HeartbeatRow).where(HeartbeatRow.enabled))
            return [_record(row) for row in rows]


def _record(row: HeartbeatRow) -> HeartbeatSettings:
    return HeartbeatSettings(row.user, row.enabled, row.every_minutes, row.channel, row.chat_id,
                             row.quiet_start, row.quiet_end, row.timezone, row.checklist)


class Heartbeats:
    """The daemon constructs it beside AgentJobs. The scheduler calls `await run(user)` at each
    interval (the text to deliver in the settings' chat, or None: nothing is sent), and sets
    `on_change` to (re)schedule or drop a user's heartbeat when /heartbeat changes it (called with
    the new settings; `enabled` and `every_minutes` say what to schedule)."""

    def __init__(self, jobs: AgentJobs, store: Store) -> None:
        self.jobs, self.settings = jobs, HeartbeatStore(store)
        self.now = store.now
        self.on_change: Callable[[HeartbeatSettings], Awaitable[None]] | None = None

    async def run(self, user: str) -> str | None:
        settings = await self.settings.get(user)
        if settings is None or not settings.enabled:
            return None
        if settings.quiet_at(self.now()):
            log.debug("heartbeat of %s skipped: their quiet hours", user)
            return None
        if not await self.jobs.gateway.access.still_allowed(user):
            return None
        checklist = settings.checklist if settings.checklist is not None else self.read_file(user)
        if not checklist.strip():  # nothing to check: no model call at all
            return None
        return await self.jobs.run(AgentJobRequest(
            user, settings.channel, settings.chat_id, PROMPT + checklist.strip(),
            only_if_attention=True, name="heartbeat"))

    async def runner(self, job: Job) -> str | None:
        """The scheduler's runner of heartbeat jobs (openclaw/scheduler/runs.py)."""
        return await self.run(job.user)

    def read_file(self, user: str) -> str:
        """HEARTBEAT.md of the user's workspace, "" when there is none. Opened as the sandbox opens
        files, without following a link: a command of theirs could make it one to a file of the
        daemon's, which would then be read into their prompt."""
        try:
            principal = self.jobs.gateway.access.principal(user)
            folder = open_folder(principal.workspace, writable_folders(principal.scope))
        except OSError as exc:
            log.warning("heartbeat of %s: their workspace cannot be opened safely: %s", user, exc)
            return ""
        try:
            fd = os.open(CHECKLIST_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
                         dir_fd=folder)
        except FileNotFoundError:
            return ""
        except OSError as exc:  # a link (ELOOP), a folder, no permission
            log.warning("heartbeat of %s: %s in their workspace is not read: %s", user,
                        CHECKLIST_FILE, exc)
            return ""
        finally:
            os.close(folder)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            return os.read(fd, CHECKLIST_MAX_BYTES).decode("utf-8", "replace")
        finally:
            os.close(fd)

    # ---- /heartbeat -------------------------------------------------------------------------

    async def command(self, msg: InboundMessage, argument: str) -> str:
        """Answer `/heartbeat ARGUMENT` from `msg`'s sender."""
        now = await self.settings.get(msg.user) or HeartbeatSettings(
            msg.user, False, DEFAULT_EVERY_MIN, msg.channel, msg.chat_id, None, None, "UTC", None)
        word, _, rest = argument.partition(" ")
        word, rest = word.lower(), rest.strip()
        if not word:
            return describe(now)
        if word == "on":
            if msg.is_group:  # it reads their checklist and tools' findings: not for a group
                return "A heartbeat speaks only in a private chat: send /heartbeat on to me there."
            new = replace(now, enabled=True, channel=msg.channel, chat_id=msg.chat_id)
        elif word == "off":
            new = replace(now, enabled=False)
        elif word == "every":
            minutes = parse_every(rest)
            if minutes is None:
                return (f"I did not understand {rest!r}: write e.g. /heartbeat every 30m or "
                        f"/heartbeat every 2h ({EVERY_MIN}m to 24h).")
            new = replace(now, every_minutes=minutes)
        elif word == "edit":
            new = replace(now, checklist=rest or None)
        elif word == "quiet":
            quiet = parse_quiet(rest)
            if isinstance(quiet, str):
                return quiet
            new = replace(now, quiet_start=quiet[0], quiet_end=quiet[1],
                          timezone=quiet[2] or now.timezone)
        else:
            return USAGE
        await self.settings.put(new)
        if self.on_change is not None and _schedule(new) != _schedule(now):
            await self.on_change(new)
        return describe(new)


async def follow_heartbeat(book: Jobs, s: HeartbeatSettings) -> None:
    """Keep the user's heartbeat as one job of kind heartbeat in the scheduler's book (their
    /jobs lists it): the one it had cancelled, and a new one at the interval, in the settings'
    chat, when it is on. `Heartbeats.on_change`, in the daemon."""
    for listed in await book.list_for(s.user):
        if listed.job.kind == JobKind.HEARTBEAT:
            await book.cancel(s.user, listed.job.number)
    if s.enabled:
        await book.add(s.user, s.chat_id, kind=JobKind.HEARTBEAT,
                       schedule=f"every {s.every_minutes} minutes", text="", timezone=s.timezone)


def _schedule(s: HeartbeatSettings) -> tuple:
    """What the scheduler's job of a heartbeat depends on."""
    return s.enabled, s.every_minutes, s.channel, s.chat_id


def describe(s: HeartbeatSettings) -> str:
    """The user's heartbeat in a few lines, as /heartbeat shows it."""
    every = f"{s.every_minutes // 60}h" if s.every_minutes % 60 == 0 else f"{s.every_minutes}m"
    lines = [f"Heartbeat: {'on' if s.enabled else 'off'}, every {every}."]
    if s.quiet_start and s.quiet_end:
        lines.append(f"Quiet hours: {s.quiet_start}-{s.quiet_end} {s.timezone}.")
    if s.checklist is not None:
        lines.append("Checklist (from /heartbeat edit):\n" + s.checklist)
    else:
        lines.append(f"Checklist: {CHECKLIST_FILE} in your workspace (empty or missing: I check "
                     "nothing and say nothing).")
    return "\n".join(lines)


def parse_every(text: str) -> int | None:
    """Minutes of "30m", "2h", "90 minutes"; None when it is not one, or out of range."""
    found = re.fullmatch(r"(\d{1,4})\s*(m|min|mins|minutes?|h|hours?)", text.strip().lower())
    if not found:
        return None
    minutes = int(found[1]) * (60 if found[2].startswith("h") else 1)
    return minutes if EVERY_MIN <= minutes <= EVERY_MAX else None


def parse_quiet(text: str) -> tuple[str | None, str | None, str | None] | str:
    """(start, end, zone or None) of "22:00-07:00 [Europe/Paris]", (None, None, None) for "off";
    else the message that says what is wrong."""
    if text.strip().lower() == "off":
        return None, None, None
    found = re.fullmatch(r"(\d{1,2}:\d{2})\s*-\s*(\d{1,2}:\d{2})(?:\s+(\S+))?", text.strip())
    wrong = f"I did not understand {text!r}: write e.g. /heartbeat quiet 22:00-07:00 Europe/Paris"
    if not found:
        return wrong
    try:
        start, end = (time.fromisoformat(t.zfill(5)) for t in (found[1], found[2]))
    except ValueError:
        return wrong
    if start == end:
        return "Quiet hours must start and end at different times."
    if found[3] is not None:
        try:
            ZoneInfo(found[3])
        except (ZoneInfoNotFoundError, ValueError):
            return f"I do not know the time zone {found[3]!r}: use an IANA name, e.g. Europe/Paris."
    return start.strftime("%H:%M"), end.strftime("%H:%M"), found[3]
