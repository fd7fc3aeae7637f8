"""The time a user means by their own words ("in 20 minutes", "9am tomorrow", "december 24 at
17:30", "every weekday at 8:00"), as an exact moment in their zone. The reminders skill and the
/remind command read `when` through this; it says how to write a time it cannot read, and refuses
a time that is past or ambiguous ("at 9": morning or evening?) rather than guess."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from skills.base import SkillError

MAX_AHEAD = timedelta(days=3660)
_UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
          "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
          "d": 86400, "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?\s*[a-z]+(?:\s*,\s*|\s+and\s+|\s*))+")
# "17:30", "17.30" (as written in much of Europe), "5pm", "9:45 am".
_CLOCK = re.compile(r"(\d{1,2})(?:[:.](\d{2}))?\s*(am|pm)?")
_CLOCK_WORDS = {"noon": "12:00", "midday": "12:00", "midnight": "0:00"}
# "17.30" alone, where a line ends with "2.50" or "3.12" as often as with a time.
_BARE_DOTTED = re.compile(r"\d{1,2}\.\d{2}")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAYS = "|".join(("today", "tomorrow", *_WEEKDAYS))
_DAY = rf"(?:on\s+)?(?:next\s+)?(?:{_DAYS})"
_DAY_AND_CLOCK = re.compile(rf"(?:on\s+)?(next\s+)?({_DAYS})\s+(?:at\s+)?(.+)")
# "9am tomorrow", "at 17:30 on friday": the day said last, read as if said first.
_CLOCK_AND_DAY = re.compile(rf"(.+?)\s+({_DAY})")
_MONTHS = {name: number for number, names in enumerate(
    (("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
     ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
     ("october", "oct"), ("november", "nov"), ("december", "dec")), 1) for name in names}
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_ORDINAL = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+(?P<year>\d{4}))?"
# A calendar date: "2026-12-24", "december 24", "dec 24th, 2026", "24 december", "the 24th of dec".
_DATES = (re.compile(r"(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})"),
          re.compile(rf"(?P<month>{_MONTH})\.?\s+{_ORDINAL}{_YEAR}"),
          re.compile(rf"(?:the\s+)?{_ORDINAL}\s+(?:of\s+)?(?P<month>{_MONTH})\.?{_YEAR}"))
# The date and the time of day, in either order: "december 24 at 9am", "9am on dec 24".
_DATE_FIRST = re.compile(r"(?:on\s+)?(.+?),?\s+(?:at\s+)?(\S+(?:\s*[ap]m)?)")
_CLOCK_FIRST = re.compile(r"((?:at\s+)?\S+(?:\s*[ap]m)?)\s+(?:on\s+)?(.+)")
# "every day at 8:00" and the like: the repeat is read off the front of `when`.
_SPOKEN_REPEAT = re.compile(
    rf"(?:(?P<daily>every ?day|each day|daily)|(?P<weekdays>every weekday|each weekday|on weekdays"
    rf"|weekdays)|every (?P<weekly>{'|'.join(_WEEKDAYS)})|(?P<week>every week|weekly))"
    rf"\s+(?P<rest>.+)")  # "at" stays in rest: "at 9" is a bare hour said as a time, "9" is not
# Repeat words that are also what a reminder is about ("weekly report", "daily standup"): a
# repeat said first must say so ("every day", "each monday", "on weekdays").
_BARE_REPEATS = frozenset({"daily", "weekly", "weekdays"})
# The most words a time takes ("on the 24th of december, 2027 at 9:45 am", "in 1 week, 2 days,
# 3 hours and 4 minutes"): split_request tries no longer ends, so a long line costs no more.
MAX_WHEN_WORDS = 16
WHEN_HELP = ("use a delay ('in 20 minutes', '2h30m'), a time ('17:30', '5pm', 'tomorrow 9:00', "
             "'friday at 8am', '9am tomorrow'), a date and time ('december 24 at 9am', "
             "'2026-12-24 09:00'), or a repeat ('every day at 8:00', 'every weekday at 7am', "
             "'every monday at 9:00')")
_TIME_MARKERS = frozenset({"in", "at", "on", "every", "each", "daily", "weekdays", "weekly", "today",
                           "tomorrow", "next", "noon", "midnight", *_WEEKDAYS})


def parse_when(when: str, now: datetime, zone: ZoneInfo) -> datetime:
    """The aware time `when` means, seen from `now` in `zone`: a wall-clock time is returned in
    `zone` with the fields it names (so its repeats keep them); SkillError saying how to write it
    when it cannot be read, is past, or is more than ten years away."""
    spoken = " ".join(when.lower().split())
    if not spoken:
        raise SkillError(f"add needs when; {WHEN_HELP}")
    try:
        due = (_delay(spoken, now) or _clock_time(spoken, now, zone) or _dated(spoken, now, zone)
               or _date_time(when.strip(), zone))
        if due is None:
            raise SkillError(f"cannot read when={when!r}; {WHEN_HELP}")
        if due <= now:  # aware datetimes of different zones compare as instants
            raise SkillError(f"{local_time(due, zone)} {zone.key} is in the past (now it is "
                             f"{local_time(now, zone)}); give a time ahead")
        far = due - now > MAX_AHEAD
    except OverflowError:  # year 1 or 9999 moved to another zone, and the like
        far = True
    if far:
        raise SkillError("that is more than ten years away")
    return due


def split_repeat(when: str) -> tuple[str | None, str]:
    """('daily', '8:00') for 'every day at 8:00'; ('weekly', 'monday 9:00') for 'every monday at
    9:00' (the first one is the next Monday); (None, when) when it names no repeat."""
    m = _SPOKEN_REPEAT.fullmatch(" ".join(when.lower().split()))
    if m is None:
        return None, when
    if m["weekly"]:
        return "weekly", f"{m['weekly']} {m['rest']}"
    return ("daily" if m["daily"] else "weekdays" if m["weekdays"] else "weekly"), m["rest"]


def split_request(request: str) -> tuple[str, str] | None:
    """(when, text) of a request in one line, the time first or last: "in 20 minutes to stretch",
    "every weekday at 8:00 pills", "call mum at 17:30". The longest readable time wins; None when
    there is no time or no text. (Readable: a time in the past still counts, to be refused as such.)"""
    words = request.split()
    if words[:1] and words[0].lower() == "me":  # "/remind me in 5 minutes to ..."
        words = words[1:]
    for k in range(min(len(words) - 1, MAX_WHEN_WORDS), 0, -1):
        # The time first ("in 5 minutes to X": the text keeps its last word, "turn it on") or
        # last ("X at 5pm"); of two readable ends, one that says it is a time ("in 5 min",
        # "at 3pm") beats a bare duration that may be part of the text ("5 min break at 3pm").
        first = (words[:k], _trim(words[k:], ("to", "that"), ()))
        last = (words[-k:], _trim(words[:-k], ("to", "that"), ("in", "at", "on")))
        found = [(when, text) for when, text in (first, last) if text and _readable(" ".join(when))]
        found.sort(key=lambda pair: pair[0][0].lower() not in _TIME_MARKERS)  # stable: first wins ties
        if found:
            when, text = found[0]
            if when is last[0]:  # the time said last
                when, text = _day_said_first(when, text)
            return " ".join(when), " ".join(text)
    return None


def _day_said_first(when: list[str], text: list[str]) -> tuple[list[str], list[str]]:
    """A day (or date, or repeat) that opens the text is the day of a time of day said at the
    end, which names none: "friday call bob at 10am" was 10am today, "friday" left in the text.
    (when, text) as they were when the text opens with no day."""
    try:
        if _wall(" ".join(when).lower().removeprefix("at "), said_at=True) is None:
            return when, text  # the end names a day itself ("tomorrow at 10am"), or is a delay
    except SkillError:  # "at 8": a bare hour, asked about once it has its day
        pass
    if text[0].lower() in _BARE_REPEATS:  # "weekly report at 5pm": a report, not a repeat
        return when, text
    for n in range(min(len(text) - 1, MAX_WHEN_WORDS - len(when)), 0, -1):
        rest = _trim(text[n:], ("to", "that"), ())
        if rest and _readable(" ".join(text[:n] + when)):
            return text[:n] + when, rest
    return when, text


def local_time(moment: datetime, zone: ZoneInfo) -> str:
    """How a moment is said back to the user: 'Thu 24 Dec 2026 09:00', in their zone."""
    local = moment.astimezone(zone)
    try:  # a time the clock skips (02:30 when it jumps from 02:00 to 03:00) rings at 03:30: say so
        local = local.astimezone(UTC).astimezone(zone)
    except OverflowError:  # year 1 or 9999: said as it is
        pass
    return f"{local:%a %d %b %Y %H:%M}"


def _trim(words: list[str], leading: tuple[str, ...], trailing: tuple[str, ...]) -> list[str]:
    if words[:1] and words[0].lower() in leading:
        words = words[1:]
    if words[-1:] and words[-1].lower() in trailing:
        words = words[:-1]
    return words


def _readable(when: str) -> bool:
    if _BARE_DOTTED.fullmatch(when):  # "buy milk 2.50", "upgrade to 3.12"; "at 17.30" is a time
        return False
    now = datetime.now().astimezone()
    try:
        parse_when(split_repeat(when)[1], now, ZoneInfo("UTC"))
    except SkillError as exc:
        return not str(exc).startswith(("cannot read", "add needs when"))
    return True


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
    """'17:30', '5pm', 'at 9:15 am': the next such time; 'today 18:00', 'tomorrow at 9am',
    '9am tomorrow'; 'friday 8:00' (this week's if still ahead, else next week's), 'next friday
    8:00' (not today's)."""
    day: date | None = None
    weekday = False
    local_now = now.astimezone(zone)
    # A bare hour before the day is a time only after "at" ("at 8 tomorrow"): in "order 3 on
    # monday" the 3 is the text's.
    if ((m := _CLOCK_AND_DAY.fullmatch(spoken))
            and _wall(m[1].removeprefix("at "), m[1].startswith("at ")) is not None):
        spoken = f"{m[2]} {m[1]}"
    if m := _DAY_AND_CLOCK.fullmatch(spoken):
        following, name, spoken = m.groups()
        if name in ("today", "tomorrow"):
            if following:
                return None
            day = local_now.date() + timedelta(days=name == "tomorrow")
        else:
            ahead = (_WEEKDAYS.index(name) - local_now.weekday()) % 7 or (7 if following else 0)
            day, weekday = local_now.date() + timedelta(days=ahead), True
    wall = _wall(spoken.removeprefix("at "), said_at=spoken.startswith("at ") or day is not None)
    if wall is None:
        return None
    if day is not None and _is_midnight(spoken):
        day, weekday = _midnight_day(day, local_now.date()), False
    local = _pass_ahead(datetime.combine(day or local_now.date(), wall, tzinfo=zone), now)
    if local <= now and (day is None or weekday):  # passed today: the next one
        local = datetime.combine(local.date() + timedelta(days=7 if weekday else 1), wall,
                                 tzinfo=zone)
    return local


def _wall(spoken: str, said_at: bool = False) -> time | None:
    """The time of day of '17:30', '17.30', '5pm', 'noon'; None for anything else. A bare hour
    said as a time ('at 9', 'tomorrow 9') is refused with SkillError: 9am or 9pm is not ours to
    guess, and a wrong guess is a missed reminder."""
    m = _CLOCK.fullmatch(_CLOCK_WORDS.get(spoken, spoken))
    if m is None:
        return None
    hour, minute = int(m.group(1)), int(m.group(2) or 0)
    if m.group(2) is None and m.group(3) is None:  # a bare "5" is not a time by itself
        if not said_at:
            return None
        if 1 <= hour <= 12:
            raise SkillError(f"'{hour}' could be {hour}am or {hour}pm: ask the user which, then say "
                             f"'{hour}am' or '{hour}pm' (or '{hour % 12 + 12}:00')")
    if m.group(3):
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if m.group(3) == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    return time(hour, minute)


def _dated(spoken: str, now: datetime, zone: ZoneInfo) -> datetime | None:
    """'december 24 at 9am', '24 dec 17:30', '9am on the 24th of december', '2026-12-24 9:00':
    that day (of the year named, else the next one to come) at that time, wall-clock in `zone`."""
    today = now.astimezone(zone).date()
    if _calendar_day(spoken, today) is not None:  # a day alone: which time is not ours to guess
        raise SkillError(f"when={spoken!r} has no time of day; add one, e.g. '{spoken} at 9am'")
    for pattern in (_DATE_FIRST, _CLOCK_FIRST):
        if not (m := pattern.fullmatch(spoken)):
            continue
        day_words, clock_words = m.groups() if pattern is _DATE_FIRST else m.groups()[::-1]
        day = _calendar_day(day_words, today)
        if day is None:
            continue
        # After the date ("december 24 9") a bare hour is said as a time; before it, only after
        # "at" ("at 9 on december 24", not "pay 2 on december 24").
        wall = _wall(clock_words.removeprefix("at "),
                     said_at=pattern is _DATE_FIRST or clock_words.startswith("at "))
        if wall is None:
            return None
        if _is_midnight(clock_words):
            day = _midnight_day(day, today)
        return _pass_ahead(datetime.combine(day, wall, tzinfo=zone), now)
    return None


def _is_midnight(clock_words: str) -> bool:
    return clock_words.removeprefix("at ") == "midnight"


def _midnight_day(day: date, today: date) -> date:
    """The day whose 00:00 is meant by 'midnight' said with `day` ("friday at midnight").
    Decided: on a later day it is asked about, as a bare "at 9" is. A calendar reads "december 31
    at midnight" as 00:00 starting Dec 31, most people mean New Year's (00:00 ending it), and a
    wrong guess is a reminder a whole day early or late. On today ("today at midnight", "monday
    at midnight" said on a Monday) the start is gone: the coming midnight, tonight's, is meant.
    "00:00" and "12am" are clock times, read as a calendar reads them (the start of the day)."""
    end = day + timedelta(days=1)
    if day <= today:
        return end
    # A weekday's name says the same within the week ahead (and keeps "every friday" a repeat).
    named = f" (or '{_WEEKDAYS[end.weekday()]} at 00:00')" if end - today < timedelta(days=7) else ""
    raise SkillError(f"'midnight' could be the start of {day:%a %d %b %Y} or its end (00:00 on "
                     f"{end:%a %d %b}): ask the user which, then say '{day} 00:00' or '{end} "
                     f"00:00'{named}")


def _pass_ahead(local: datetime, now: datetime) -> datetime:
    """`local`, or its second pass when a DST change repeats its hour and only that one is still
    ahead. Compared with `now` (UTC), as instants: between two times of one zone Python compares
    the wall clock, which is wrong in the repeated hour."""
    return local.replace(fold=1) if local <= now < local.replace(fold=1) else local


def _calendar_day(words: str, today: date) -> date | None:
    """The date of '2026-12-24', 'december 24', 'dec 24th, 2026', '24 dec', 'the 24th of december';
    without a year, the next such day from today on (today's included); None if not a date.
    SkillError for a day no calendar has (february 30)."""
    for pattern in _DATES:
        if not (m := pattern.fullmatch(words)):
            continue
        month = _MONTHS.get(m["month"]) or int(m["month"])
        day, year = int(m["day"]), int(m["year"]) if m["year"] else None
        try:
            if year is not None:
                return date(year, month, day)
            found = date(today.year, month, day) if (month, day) != (2, 29) else None
            return found if found and found >= today else _next_year_day(today, month, day)
        except ValueError:
            raise SkillError(f"{words!r} is not a day of the calendar") from None
    return None


def _next_year_day(today: date, month: int, day: int) -> date:
    """The first (month, day) after today: next year's, or for February 29 the next leap year's."""
    for year in range(today.year, today.year + 9):
        try:
            found = date(year, month, day)
        except ValueError:  # February 29 of a common year
            continue
        if found >= today:
            return found
    raise ValueError(day)


def _date_time(when: str, zone: ZoneInfo) -> datetime | None:
    """ISO 8601 with a time; without an offset it is wall-clock time in `zone`."""
    try:
        parsed = datetime.fromisoformat(when)
    except ValueError:
        return None
    if not any(c in when for c in ":Tt"):  # a date alone: which time is not ours to guess
        raise SkillError(f"when={when!r} has no time of day; add one, e.g. '{when} 09:00'")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=zone)
