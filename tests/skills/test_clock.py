"""The clock skill: the time in the zone the config gives it, the one reminders use too."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from openclaw.config import ConfigError, load_config
from openclaw.reminders import Reminders
from openclaw.skillset import configured_skills
from openclaw.store import Store
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


@pytest.mark.parametrize("table", ["clock", "reminders"])
async def test_a_zone_set_for_either_the_clock_or_reminders_is_both_of_theirs(tmp_path, monkeypatch,
                                                                               table):
    # The model reads the clock to say when a reminder rings: one zone, wherever it is set.
    monkeypatch.setenv("TZ", "UTC")
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path}/data"\n[skills]\nenabled = ["clock", "reminders"]\n'
                    f'[skills.{table}]\ntimezone = "Asia/Tokyo"\n')
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/s.db")
    try:
        run = Executor(configured_skills(load_config(path)), sandbox=None,
                       reminders=Reminders(store))
        principal = Policy({}, tmp_path, lambda u: "admin").principal("telegram:1")
        clock = await run.call("clock", {}, principal, chat_id="1")
        listed = await run.call("reminders", {"action": "list"}, principal, chat_id="1")
        assert clock.text.endswith(", Asia/Tokyo)"), clock.text
        assert listed.text.startswith("Now: ") and " Asia/Tokyo. " in listed.text, listed.text
    finally:
        await store.close()


def test_two_different_zones_for_the_clock_and_reminders_are_refused_naming_both(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path}/data"\n[skills]\nenabled = ["clock", "reminders"]\n'
                    '[skills.clock]\ntimezone = "Asia/Tokyo"\n'
                    '[skills.reminders]\ntimezone = "Europe/Paris"\n')
    with pytest.raises(ConfigError) as refused:
        configured_skills(load_config(path))
    assert refused.value.problems == [
        "skills.clock.timezone ('Asia/Tokyo') and skills.reminders.timezone ('Europe/Paris') differ: "
        "the model reads the clock to say when a reminder rings; set one zone, in either table"]
