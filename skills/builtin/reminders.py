"""`reminders`: the user's own reminders, delivered into the chat they were set from at the time
they meant: once, or daily, on weekdays or weekly. The daemon keeps and delivers them (the context's
ReminderBook); this skill turns what the model wrote ("in 20 minutes", "17:30", "2026-12-24 09:00")
into an exact time and says it back, with its zone, so a misunderstanding shows at once."""

from __future__ import annotations

import os
import re
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from skills.base import ReminderBook, Skill, SkillContext, SkillError, visible

MAX_TEXT_CHARS = 1000
MAX_AHEAD = timedelta(days=3660)
_UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
          "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
          "d": 86400, "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?\s*[a-z]+(?:\s*,\s*|\s+and\s+|\s*))+")
_CLOCK = re.compile(r"(\d{1,2})(?::(\d{2}))?\s*(am|pm)?")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAYS = "|".join(("today", "tomorrow", *_WEEKDAYS))
_DAY_AND_CLOCK = re.compile(rf"(?:on\s+)?(next\s+)?({_DAYS})\s+(?:at\s+)?(.+)")
# "every day at 8:00" and the like: the repeat is read off the front of `when`.
_SPOKEN_REPEAT = re.compile(
    rf"(?:(?P<daily>every ?day|each day|daily)|(?P<weekdays>every weekday|each weekday|on weekdays"
    rf"|weekdays)|every (?P<weekly>{'|'.join(_WEEKDAYS)})|(?P<week>every week|weekly))"
    rf"(?:\s+at)?\s+(?P<rest>.+)")
_CLOCK_WORDS = {"noon": "12:00", "midday": "12:00", "midnight": "0:00"}
WHEN_HELP = ("use a delay ('in 20 minutes', '2h30m'), a time ('17:30', '5pm', 'tomorrow 9:00', "
             "'friday at 8am'), a date and time ('2026-12-24 09:00'), or a repeat ('every day at "
             "8:00', 'every weekday at 7am', 'every monday at 9:00')")


class RemindersSkill(Skill):
    name = "reminders"
    description = ("Remind the user of something later, in this chat: add a reminder (once or "
                   "repeating), list the user's reminders, or cancel one by its number.")
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "list", "cancel"]},
            "text": {"type": "string", "description": "add: what to remind the user of"},
            # The user's words, not a date the model worked out: a model's idea of "now" is
            # often wrong, and the skill says the exact time back.
            "when": {"type": "string", "description": "add: the user's own words for the time: "
                                                      + WHEN_HELP.removeprefix("use ")},
            "repeat": {"type": "string", "enum": ["none", "daily", "weekdays", "weekly"]},
            "number": {"type": "integer", "description": "cancel: the reminder's number (#N)"},
            "timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris; "
                                                          "default: the owner's"},
        },
        "required": ["action"],
    }

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        zone = settings.get("timezone")
        if zone is not None and _zone(zone) is None:
            return [f"timezone: unknown time zone {zone!r}; use an IANA name such as 'Europe/Paris'"]
        return []

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        book = ctx.reminders
        if book is None:
            raise SkillError("reminders need the running daemon, which delivers them")
        action = args["action"]
        if action == "list":
            return await _list(book, ctx)
        if action == "cancel":
            number = args.get("number")
            if not isinstance(number, int):
                raise SkillError("cancel needs the reminder's number (list shows them)")
            done = await book.cancel(ctx.user, number)
            if done is None:
                raise SkillError(f"you have no active reminder #{number}; list shows them")
            if done.chat_id != ctx.chat_id:  # this chat may be a group: not the text of another's
                return f"Cancelled reminder #{done.number} (set in another chat)."
            return f"Cancelled reminder #{done.number}: {done.text}"
        return await _add(book, args, ctx)

    def describe(self, args: dict[str, Any]) -> str:
        if args.get("action") != "add":
            return super().describe(args)
        # An approval prompt: escaped, so the model's text cannot add a line to it.
        return f"remind you {visible(str(args.get('when', '?')))}: {visible(str(args.get('text', '')))}"


async def _add(book: ReminderBook, args: dict[str, Any], ctx: SkillContext) -> str:
    text = str(args.get("text") or "").strip()
    if not text:
        raise SkillError("add needs the text of the reminder")
    if len(text) > MAX_TEXT_CHARS:
        raise SkillError(f"the text is {len(text)} characters; at most {MAX_TEXT_CHARS}")
    if not ctx.chat_id:
        raise SkillError("a reminder needs a chat to be delivered to, and this call has none")
    zone_name = _zone_name(args, ctx)
    zone = ZoneInfo(zone_name)
    now = book.now()
    spoken_repeat, when = split_repeat(str(args.get("when") or ""))
    repeat = args.get("repeat") or "none"
    if repeat == "none" and spoken_repeat:
        repeat = spoken_repeat
    due = parse_when(when, now, zone)
    moved = ""
    if repeat == "weekdays" and due.astimezone(zone).weekday() >= 5:  # starts on the next Monday
        local = due if due.tzinfo is zone else due.astimezone(zone)
        monday = local.date() + timedelta(days=7 - local.weekday())
        due = datetime.combine(monday, local.time(), tzinfo=zone)
        moved = " (moved to Monday: it repeats on weekdays)"
    reminder = await book.add(ctx.user, ctx.chat_id, text, due,
                              repeat=None if repeat == "none" else repeat, timezone=zone_name)
    if reminder is None:
        raise SkillError("you have too many active reminders; cancel some first")
    every = "" if repeat == "none" else f", then {repeat}"
    return (f"Reminder #{reminder.number} set for {_local(due, zone)} {zone_name}{moved} "
            f"(in {_span(due - now)}){every}: {text}")


async def _list(book: ReminderBook, ctx: SkillContext) -> str:
    """The user's reminders for this chat. Those set elsewhere are only counted: this chat may be
    a group, and a reminder set in a private chat is nobody else's business."""
    zone_name = _zone_name({}, ctx)
    now = book.now()
    lines = [f"Now: {_local(now, ZoneInfo(zone_name))} {zone_name}."]
    reminders = await book.pending(ctx.user)
    here = [r for r in reminders if r.chat_id == ctx.chat_id]
    for r in here:
        every = f" (repeats {r.repeat})" if r.repeat else ""
        lines.append(f"#{r.number} {_local(r.due_at, ZoneInfo(r.timezone))} {r.timezone}{every}: {r.text}")
    if not here:
        lines[0] += " You have no reminders in this chat."
    if elsewhere := len(reminders) - len(here):
        lines.append(f"({elsewhere} more in other chats: ask there to see them.)")
    return "\n".join(lines)


def split_request(request: str) -> tuple[str, str] | None:
    """(when, text) of a request in one line, the time first or last: "in 20 minutes to stretch",
    "every weekday at 8:00 pills", "call mum at 17:30". The longest readable time wins; None when
    there is no time or no text. (Readable: a time in the past still counts, to be refused as such.)"""
    words = request.split()
    if words[:1] and words[0].lower() == "me":  # "/remind me in 5 minutes to ..."
        words = words[1:]
    for k in range(len(words) - 1, 0, -1):
        # The time first ("in 5 minutes to X": the text keeps its last word, "turn it on") or
        # last ("X at 5pm"); of two readable ends, one that says it is a time ("in 5 min",
        # "at 3pm") beats a bare duration that may be part of the text ("5 min break at 3pm").
        first = (words[:k], _trim(words[k:], ("to", "that"), ()))
        last = (words[-k:], _trim(words[:-k], ("to", "that"), ("in", "at", "on")))
        found = [(when, text) for when, text in (first, last) if text and _readable(" ".join(when))]
        found.sort(key=lambda pair: pair[0][0].lower() not in _TIME_MARKERS)  # stable: first wins ties
        if found:
            when, text = found[0]
            return " ".join(when), " ".join(text)
    return None


_TIME_MARKERS = frozenset({"in", "at", "on", "every", "each", "daily", "weekdays", "weekly", "today",
                           "tomorrow", "next", "noon", "midnight", *_WEEKDAYS})


def _trim(words: list[str], leading: tuple[str, ...], trailing: tuple[str, ...]) -> list[str]:
    if words[:1] and words[0].lower() in leading:
        words = words[1:]
    if words[-1:] and words[-1].lower() in trailing:
        words = words[:-1]
    return words


def _readable(when: str) -> bool:
    now = datetime.now().astimezone()
    try:
        parse_when(split_repeat(when)[1], now, ZoneInfo("UTC"))
    except SkillError as exc:
        return not str(exc).startswith(("cannot read", "add needs when"))
    return True


def split_repeat(when: str) -> tuple[str | None, str]:
    """('daily', '8:00') for 'every day at 8:00'; ('weekly', 'monday 9:00') for 'every monday at
    9:00' (the first one is the next Monday); (None, when) when it names no repeat."""
    m = _SPOKEN_REPEAT.fullmatch(" ".join(when.lower().split()))
    if m is None:
        return None, when
    if m["weekly"]:
        return "weekly", f"{m['weekly']} {m['rest']}"
    return ("daily" if m["daily"] else "weekdays" if m["weekdays"] else "weekly"), m["rest"]


def parse_when(when: str, now: datetime, zone: ZoneInfo) -> datetime:
    """The aware time `when` means, seen from `now` in `zone`: a wall-clock time is returned in
    `zone` with the fields it names (so its repeats keep them); SkillError saying how to write it
    when it cannot be read, is past, or is more than ten years away."""
    spoken = " ".join(when.lower().split())
    if not spoken:
        raise SkillError(f"add needs when; {WHEN_HELP}")
    try:
        due = _delay(spoken, now) or _clock_time(spoken, now, zone) or _date_time(when.strip(), zone)
        if due is None:
            raise SkillError(f"cannot read when={when!r}; {WHEN_HELP}")
        if due <= now:  # aware datetimes of different zones compare as instants
            raise SkillError(f"{_local(due, zone)} {zone.key} is in the past (now it is "
                             f"{_local(now, zone)}); give a time ahead")
        far = due - now > MAX_AHEAD
    except OverflowError:  # year 1 or 9999 moved to another zone, and the like
        far = True
    if far:
        raise SkillError("that is more than ten years away")
    return due


def _delay(spoken: str, now: datetime) -> datetime | None:
    spoken = spoken.removeprefix("in ").removesuffix(" from now").replace("half an hour", "30 min")
    spoken = re.sub(r"\ban? (?=[a-z])", "1 ", spoken)  # "an hour", "a minute"
    if not _DURATION.fullmatch(spoken):
        return None
    seconds = 0.0
    for amount, unit in _DURATION_PART.findall(spoken):
        if unit not in _UNITS:
            return None
        seconds += float(amount) * _UNITS[unit]
    if seconds > MAX_AHEAD.total_seconds():  # refused by the caller; may not fit a timedelta
        seconds = MAX_AHEAD.total_seconds() + 86400
    return now + timedelta(seconds=seconds)


def _clock_time(spoken: str, now: datetime, zone: ZoneInfo) -> datetime | None:
    """'17:30', '5pm', 'at 9:15 am': the next such time; 'today 18:00', 'tomorrow at 9am';
    'friday 8:00' (this week's if still ahead, else next week's), 'next friday 8:00' (not today's)."""
    day: date | None = None
    weekday = False
    local_now = now.astimezone(zone)
    if m := _DAY_AND_CLOCK.fullmatch(spoken):
        following, name, spoken = m.groups()
        if name in ("today", "tomorrow"):
            if following:
                return None
            day = local_now.date() + timedelta(days=name == "tomorrow")
        else:
            ahead = (_WEEKDAYS.index(name) - local_now.weekday()) % 7 or (7 if following else 0)
            day, weekday = local_now.date() + timedelta(days=ahead), True
    spoken = spoken.removeprefix("at ")
    m = _CLOCK.fullmatch(_CLOCK_WORDS.get(spoken, spoken))
    if m is None or (m.group(2) is None and m.group(3) is None):  # a bare "5" is not a time
        return None
    hour, minute = int(m.group(1)), int(m.group(2) or 0)
    if m.group(3):
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if m.group(3) == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    wall = time(hour, minute)
    local = datetime.combine(day or local_now.date(), wall, tzinfo=zone)
    # Compared with `now` (UTC), as instants: between two times of one zone Python compares the
    # wall clock, which is wrong in the hour a DST change repeats.
    if local <= now and local.replace(fold=1) > now:  # its second pass is still ahead
        local = local.replace(fold=1)
    elif local <= now and (day is None or weekday):  # passed today: the next one
        local = datetime.combine(local.date() + timedelta(days=7 if weekday else 1), wall,
                                 tzinfo=zone)
    return local


def _date_time(when: str, zone: ZoneInfo) -> datetime | None:
    """ISO 8601 with a time; without an offset it is wall-clock time in `zone`."""
    try:
        parsed = datetime.fromisoformat(when)
    except ValueError:
        return None
    if not any(c in when for c in ":Tt"):  # a date alone: which time is not ours to guess
        raise SkillError(f"when={when!r} has no time of day; add one, e.g. '{when} 09:00'")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=zone)


def _zone_name(args: dict[str, Any], ctx: SkillContext) -> str:
    name = args.get("timezone") or ctx.settings.get("timezone") or local_zone_name()
    if _zone(name) is None:
        raise SkillError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris'")
    return name


def _zone(name: Any) -> ZoneInfo | None:
    try:
        return ZoneInfo(name) if isinstance(name, str) and name else None
    except (ZoneInfoNotFoundError, ValueError):
        return None


def local_zone_name() -> str:
    """This machine's zone as an IANA name (TZ, /etc/timezone, or the /etc/localtime link), so a
    reminder repeats at the same wall-clock time across DST changes; "UTC" when none is found."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    with_timezone = Path("/etc/timezone")
    if with_timezone.is_file():
        candidates.append(with_timezone.read_text().strip())
    localtime = Path("/etc/localtime")
    if localtime.is_symlink():
        target = str(localtime.resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    return next((c for c in candidates if _zone(c) is not None), "UTC")


def _local(moment: datetime, zone: ZoneInfo) -> str:
    return f"{moment.astimezone(zone):%a %d %b %Y %H:%M}"


def _span(delta: timedelta) -> str:
    minutes = round(delta.total_seconds() / 60)
    if minutes < 1:
        return f"{max(round(delta.total_seconds()), 1)} s"
    days, rest = divmod(minutes, 1440)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    return " ".join(p for p in parts if p)
