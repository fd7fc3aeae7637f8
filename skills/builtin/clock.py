"""`clock`: the current date and time, optionally in a named time zone. Harmless by design."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from skills.base import Skill, SkillContext, SkillError


class ClockSkill(Skill):
    name = "clock"
    description = "Get the current date and time (ISO 8601, weekday), in UTC or a given time zone."
    parameters = {
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris"}},
    }

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        name = args.get("timezone") or ctx.settings.get("timezone") or "UTC"
        try:
            zone = UTC if name == "UTC" else ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise SkillError(f"unknown time zone {name!r}; use an IANA name such as "
                             "'Europe/Paris'") from exc
        now = datetime.now(zone)
        return f"{now.isoformat(timespec='seconds')} ({now:%A}, {name})"
