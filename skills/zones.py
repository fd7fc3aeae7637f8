"""Time zones for skills that read or say a time of day: the zone a call means, the check of a
`timezone` setting, and one zone for the clock and reminders (one_zone, applied by the daemon to
their [skills.NAME] tables, else this machine's), so both say the same wall-clock time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from skills.base import SkillError


def zone(name: Any) -> ZoneInfo | None:
    """The zone an IANA name ("Europe/Paris", "UTC") names; None for anything else."""
    try:
        return ZoneInfo(name) if isinstance(name, str) and name else None
    except (ZoneInfoNotFoundError, ValueError):
        return None


# How long a MachineZone keeps the zone its files name: a clock call reads it at every turn that
# asks the time (tens of microseconds of file checks); a changed zone shows within this.
FILES_ZONE_SECONDS = 60.0


def local_zone_name() -> str:
    """This machine's zone as an IANA name (TZ, /etc/timezone, or the /etc/localtime link), so a
    reminder repeats at the same wall-clock time across DST changes; "UTC" when none is found."""
    return _zone_of_env() or _zone_of_files() or "UTC"


class MachineZone:
    """local_zone_name, with the zone files read at most once a FILES_ZONE_SECONDS (TZ, when it
    names a zone, counts at once): for a skill that says the time at every call."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._read_at = float("-inf")
        self._files: str | None = None

    def name(self) -> str:
        if from_env := _zone_of_env():
            return from_env
        now = self._clock()
        if now - self._read_at >= FILES_ZONE_SECONDS:
            self._read_at, self._files = now, _zone_of_files()
        return self._files or "UTC"


def _zone_of_env() -> str | None:
    name = os.environ.get("TZ", "").lstrip(":")
    return name if zone(name) is not None else None


def _zone_of_files() -> str | None:
    candidates = []
    with_timezone = Path("/etc/timezone")
    if with_timezone.is_file():
        candidates.append(with_timezone.read_text().strip())
    localtime = Path("/etc/localtime")
    if localtime.is_symlink():
        target = str(localtime.resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    return next((c for c in candidates if zone(c) is not None), None)


def zone_name(args: dict[str, Any], settings: dict[str, Any],
              local: Callable[[], str] = local_zone_name) -> str:
    """The zone a call means: its own `timezone` argument, the skill's setting, this machine's
    (`local`: a MachineZone's name, for one kept a while)."""
    name = args.get("timezone") or settings.get("timezone") or local()
    if zone(name) is None:
        raise SkillError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris'")
    return name


def timezone_setting_problems(skill: str, settings: dict[str, Any]) -> list[str]:
    """Problems with a [skills.NAME] table whose one setting is `timezone`, each naming the key:
    an unknown zone, and any other key (a typo such as `timzone` would otherwise leave the machine's
    zone in use without a word)."""
    problems = [f"{key}: unknown setting ({skill} takes only timezone)"
                for key in settings if key != "timezone"]
    name = settings.get("timezone")
    if name is not None and zone(name) is None:
        problems.append(f"timezone: unknown time zone {name!r}; use an IANA name such as "
                        "'Europe/Paris'")
    return problems


# The model reads the clock to say when a reminder rings ("at 9am"): they must agree on the zone.
# The `timezone` argument of the skills that read times in the user's zone.
TIMEZONE_PARAMETER = {"type": "string",
                      "description": "IANA name, e.g. Europe/Paris; default: the owner's"}
SAME_ZONE = ("clock", "reminders", "schedule")


def one_zone(settings: dict[str, dict[str, Any]], enabled: list[str]) -> list[str]:
    """Give every enabled skill of SAME_ZONE the `timezone` one of them sets (in `settings`, the
    [skills.NAME] tables); problems, naming the keys, when they set different ones."""
    named = {name: settings[name]["timezone"] for name in SAME_ZONE
             if "timezone" in settings.get(name, {})}
    if len(set(named.values())) > 1:
        keys = " and ".join(f"skills.{name}.timezone ({zone!r})" for name, zone in named.items())
        return [f"{keys} differ: the model reads the clock to say when a reminder rings; set one "
                "zone, in either table"]
    for name_of_zone in named.values():
        if zone(name_of_zone) is None:  # said once, by the skill whose key it is
            continue
        for name in SAME_ZONE:
            if name in enabled:
                settings.setdefault(name, {}).setdefault("timezone", name_of_zone)
    return []
