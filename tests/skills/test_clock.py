"""The clock skill: the time in the zone the config gives it, the one reminders use too."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from sandbox.policy import Policy
from skills.builtin.clock import ClockSkill
from skills.executor import Executor
from skills.registry import SkillRegistry


@pytest.mark.parametrize("settings, args, zone", [
    ({"timezone": "Asia/Tokyo"}, {}, "Asia/Tokyo"),  # [skills.clock] timezone
    ({"timezone": "Asia/Tokyo"}, {"timezone": "America/New_York"}, "America/New_York"),
    ({}, {}, None),  # this machine's zone, the one reminders use too
])
async def test_the_clock_says_the_time_in_its_configured_zone(tmp_path, monkeypatch, settings, args,
                                                               zone):
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    registry = SkillRegistry()
    registry.add(ClockSkill(), "built-in", settings)
    run, policy = Executor(registry, sandbox=None), Policy({}, tmp_path, lambda u: "user")
    told = await run.call("clock", args, policy.principal("telegram:1"), chat_id="1")
    assert told.ok, told.text
    zone = zone or "Asia/Kolkata"
    assert told.text.endswith(f", {zone})")
    said = datetime.fromisoformat(told.text.split(" ")[0])
    assert said.utcoffset() == datetime.now(ZoneInfo(zone)).utcoffset()
