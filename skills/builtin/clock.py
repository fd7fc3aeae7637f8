"""`clock`: the current date and time, in the configured time zone or a named one. Harmless by
design."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from skills.base import Skill, SkillContext
from skills.zones import MachineZone, timezone_setting_problems, zone_name


class ClockSkill(Skill):
    name = "clock"
    description = ("Get the current date and time (ISO 8601, weekday), in the user's time zone or "
                   "a given one.")
    parameters = {
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris"}},
    }
    side_effects = False
    untrusted_output = False  # the daemon's own clock

    def __init__(self) -> None:
        self.machine_zone = MachineZone()

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        return timezone_setting_problems(cls.name, settings)

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        # The same default as reminders' ([skills.clock] timezone, else this machine's zone): the
        # model reads the time here to say "at 9am" there.
        name = zone_name(args, ctx.settings, self.machine_zone.name)
        now = datetime.now(ZoneInfo(name))
        return f"{now.isoformat(timespec='seconds')} ({now:%A}, {name})"
