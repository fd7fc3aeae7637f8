"""What a schedule says, read and stored: once (a time, or "in 20 minutes"), a five-field cron
expression or an @daily form, or an interval ("every 30m"); each meant in the user's zone. Stored
as a short spec ("once 2026-12-24T08:00:00+00:00", "cron 0 8 * * 1-5", "every 1800s") and turned
into the APScheduler trigger that fires it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

MIN_INTERVAL_S = 60  # a job every second would be a busy loop on the model
MAX_INTERVAL_S = 366 * 86400
SCHEDULE_HELP = ("a time ('once 2026-12-24 08:00', in the job's zone), a cron "
                 "expression of five fields ('0 8 * * 1-5': minute hour day month weekday, "
                 "0 or 7 = Sunday) or @hourly/@daily/@weekly/@monthly/@yearly, or an interval "
                 "('every 30m', 'every 2 hours')")
# The usual @ forms, as the five fields they stand for.
AT_FORMS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
            "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
            "@hourly": "0 * * * *"}
_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600,
          "hr": 3600, "hour": 3600, "d": 86400, "day": 86400, "w": 604800, "week": 604800}
_INTERVAL = re.compile(r"every\s+(\d+)?\s*([a-z]+?)s?")
_CRON_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


class ScheduleError(ValueError):
    """A schedule that cannot be read; the message says how to write one."""


@dataclass(frozen=True, slots=True)
class Schedule:
    spec: str  # what the jobs table keeps
    shown: str  # what the user is told: "every weekday ..." is theirs, this is exact

    def trigger(self, zone: ZoneInfo, start: datetime | None = None) -> BaseTrigger:
        return trigger_for(self.spec, zone, start)


def parse_schedule(text: str, zone: ZoneInfo, now: datetime) -> Schedule:
    """`text` as a schedule, seen from `now` in `zone`; ScheduleError saying how to write it."""
    spoken = " ".join(text.strip().split())
    lowered = spoken.lower()
    if not spoken:
        raise ScheduleError(f"the schedule is empty; give {SCHEDULE_HELP}")
    if lowered.startswith("cron "):
        lowered = spoken = spoken[5:].strip()
    if lowered in AT_FORMS or (len(spoken.split()) == 5 and not lowered.startswith(("in ", "every "))
                               and re.fullmatch(r"[\d*/,\-a-z ]+", lowered)
                               and not re.search(r"[ap]m\b|:", lowered)):
        fields = AT_FORMS.get(lowered, lowered)
        cron_trigger(fields, zone)  # raises if it is not one
        return Schedule(f"cron {fields}", f"cron '{fields}' ({zone.key})")
    if lowered.startswith("every ") or lowered.startswith("interval "):
        seconds = interval_seconds(lowered.removeprefix("interval ").removeprefix("every "))
        return Schedule(f"every {seconds}s", f"every {_span(seconds)}")
    due = _once(spoken.removeprefix("once ").removeprefix("at ").strip(), zone)
    if due <= now:
        raise ScheduleError(f"{due.astimezone(zone):%Y-%m-%d %H:%M} {zone.key} is past; give a "
                            "time ahead")
    utc = due.astimezone(UTC)
    return Schedule(f"once {utc.isoformat()}", f"once at {due.astimezone(zone):%Y-%m-%d %H:%M} "
                                               f"{zone.key}")


def _once(text: str, zone: ZoneInfo) -> datetime:
    """An ISO date and time; without an offset, a wall-clock time in `zone` (the skill turns
    the user's own words, "in 20 minutes", into one: skills.builtin.spoken_time)."""
    try:
        due = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError(f"cannot read the schedule {text!r}; give {SCHEDULE_HELP}") from None
    return due.replace(tzinfo=zone) if due.tzinfo is None else due


def interval_seconds(spoken: str) -> int:
    """"30m", "2 hours", "1d" as seconds, within MIN_INTERVAL_S..MAX_INTERVAL_S."""
    match = _INTERVAL.fullmatch("every " + spoken.strip().lower())
    unit = _UNITS.get(match[2]) if match else None
    if unit is None:
        raise ScheduleError(f"cannot read the interval {spoken!r}; write e.g. 'every 30m', "
                            "'every 2 hours', 'every 1d'")
    seconds = int(match[1] or 1) * unit
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise ScheduleError(f"the interval {spoken!r} is {seconds} s; it must be between "
                            f"{MIN_INTERVAL_S} s and {MAX_INTERVAL_S // 86400} days")
    return seconds


def cron_trigger(fields: str, zone: ZoneInfo) -> CronTrigger:
    """Five cron fields as a trigger in `zone`; ScheduleError naming the bad field.

    APScheduler 3 counts weekdays from Monday = 0, cron from Sunday = 0 (and 7): the weekday field
    is rewritten as day names, so "1-5" means Monday to Friday, as in crontab."""
    parts = fields.split()
    if len(parts) != 5:
        raise ScheduleError(f"a cron expression has five fields (minute hour day month weekday), "
                            f"{fields!r} has {len(parts)}; e.g. '0 8 * * 1-5'")
    try:
        weekdays = _cron_weekdays(parts[4])
        return WallCronTrigger(minute=parts[0], hour=parts[1], day=parts[2], month=parts[3],
                               day_of_week=weekdays, timezone=zone)
    except ValueError as exc:
        raise ScheduleError(f"bad cron expression {fields!r}: {exc}; e.g. '0 8 * * 1-5' "
                            "(minute hour day month weekday)") from None


class WallCronTrigger(CronTrigger):
    """A CronTrigger that, as cron does, runs a job at a set hour once when the clock goes back
    and that hour comes twice ("30 2 * * *" fired at 02:30 summer time and again at 02:30 winter
    time); one at every hour ("0 * * * *") still runs each real hour."""

    def get_next_fire_time(self, previous_fire_time: datetime | None,
                           now: datetime) -> datetime | None:
        due = super().get_next_fire_time(previous_fire_time, now)
        if due is None or str(self.fields[5]) == "*" or not _second_pass(due):
            return due
        return self.get_next_fire_time(due, due.astimezone(UTC) + timedelta(microseconds=1))


def _second_pass(moment: datetime) -> bool:
    """Whether `moment` is the second of two instants with its wall-clock time (the hour the
    clock went back over)."""
    first, second = moment.replace(fold=0), moment.replace(fold=1)
    return first.utcoffset() != second.utcoffset() and moment.utcoffset() == second.utcoffset()


def _cron_weekdays(field: str) -> str:
    """A crontab weekday field ("1-5", "0,6", "*/2", "mon-fri") as APScheduler day names."""
    if field in ("*", "?"):
        return "*"
    days: set[int] = set()
    for item in field.split(","):
        base, _, step = item.partition("/")
        if base in ("*", ""):
            low, high = 0, 6
        else:
            low_text, _, high_text = base.partition("-")
            low = _cron_day(low_text)
            high = _cron_day(high_text) if high_text else (6 if step else low)
            if high_text and high == 0:  # "5-0" / "5-7": to Sunday at the end of the week
                high = 7
        every = int(step) if step else 1
        if every < 1 or high < low:
            raise ValueError(f"weekday {item!r} is not a range cron reads")
        days.update(day % 7 for day in range(low, high + 1, every))
    return ",".join(_CRON_DAYS[day] for day in sorted(days))


def _cron_day(text: str) -> int:
    if text.lower()[:3] in _CRON_DAYS:
        return _CRON_DAYS.index(text.lower()[:3])
    if not text.isdigit() or int(text) > 7:
        raise ValueError(f"weekday {text!r} is not 0-7 (0 and 7 = Sunday) or a day name")
    return int(text)


def trigger_for(spec: str, zone: ZoneInfo, start: datetime | None = None) -> BaseTrigger:
    """The APScheduler trigger of a stored spec. `start`: an interval's anchor (its job's
    creation), so a restart keeps its times instead of counting again from now."""
    kind, _, value = spec.partition(" ")
    if kind == "once":
        return DateTrigger(run_date=datetime.fromisoformat(value), timezone=zone)
    if kind == "cron":
        return cron_trigger(value, zone)
    if kind == "every":
        seconds = int(value.removesuffix("s"))
        first = (start or datetime.now(UTC)) + timedelta(seconds=seconds)
        return IntervalTrigger(seconds=seconds, start_date=first.astimezone(zone), timezone=zone)
    raise ScheduleError(f"unknown schedule {spec!r}")


def _span(seconds: int) -> str:
    for name, unit in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % unit == 0:
            count = seconds // unit
            return f"{count} {name}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


__all__ = ["AT_FORMS", "SCHEDULE_HELP", "Schedule", "ScheduleError", "cron_trigger",
           "interval_seconds", "parse_schedule", "trigger_for"]
