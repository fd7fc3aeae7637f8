"""The `schedule` skill and what it schedules: the triggers each schedule becomes (pure: APScheduler
triggers asked for their next times at chosen instants, DST transitions included), and the skill's
calls through the executor into the daemon's real job book (a SQLite store with a fixed clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from openclaw.scheduler.book import Jobs
from openclaw.scheduler.triggers import ScheduleError, parse_schedule, trigger_for
from openclaw.store import JobStatus, Store
from sandbox.policy import Policy
from skills.builtin.schedule import JOBS_USAGE, ScheduleSkill
from skills.executor import Executor
from skills.registry import SkillRegistry

PARIS = ZoneInfo("Europe/Paris")
NOW = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)  # a Monday; 10:15 in Paris


def fire_times(spec: str, start: datetime, count: int, zone: ZoneInfo = PARIS) -> list[datetime]:
    """The first `count` fire times after `start`, in UTC, as the scheduler asks for them."""
    trigger, times, previous, now = trigger_for(spec, zone, start), [], None, start
    for _ in range(count):
        previous = trigger.get_next_fire_time(previous, now)
        times.append(previous.astimezone(UTC))
        now = times[-1] + timedelta(microseconds=1)  # in UTC: wall-clock arithmetic loses fold
    return times


def utc(day: int, hour: int, minute: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def test_crontab_weekdays_count_from_sunday_as_cron_does():
    """APScheduler 3 counts weekdays from Monday = 0: '1-5' would be Tuesday to Saturday."""
    saturday = datetime(2026, 12, 5, 12, tzinfo=PARIS)
    days = [t.astimezone(PARIS).strftime("%a") for t in fire_times("cron 0 8 * * 1-5", saturday, 6)]
    assert days == ["Mon", "Tue", "Wed", "Thu", "Fri", "Mon"]
    for sunday in ("0", "7", "sun"):
        [first] = fire_times(f"cron 0 8 * * {sunday}", saturday, 1)
        assert first.astimezone(PARIS).strftime("%a %H:%M") == "Sun 08:00"
    assert [t.astimezone(PARIS).strftime("%a") for t in fire_times("cron 0 8 * * 5-7", saturday, 3)] \
        == ["Sun", "Fri", "Sat"]  # Saturday 08:00 has passed


def test_a_daily_cron_keeps_its_wall_clock_time_across_both_dst_changes():
    spring = fire_times("cron 0 8 * * *", datetime(2026, 3, 28, 12, tzinfo=PARIS), 2)
    autumn = fire_times("cron 0 8 * * *", datetime(2026, 10, 24, 12, tzinfo=PARIS), 2)
    assert spring == [utc(29, 6), utc(30, 6)]  # 08:00 CEST; 08:00 CET was 07:00 UTC
    assert autumn == [utc(25, 7, month=10), utc(26, 7, month=10)]


def test_a_job_in_the_hour_the_clock_skips_runs_once_that_day_an_hour_later():
    times = fire_times("cron 30 2 * * *", datetime(2026, 3, 27, 12, tzinfo=PARIS), 3)
    # 02:30 CET on the 28th; on the 29th 02:30 does not exist: 01:30 UTC is 03:30 CEST; then 02:30 CEST.
    assert times == [utc(28, 1, 30), utc(29, 1, 30), utc(30, 0, 30)]


def test_a_job_in_the_hour_the_clock_repeats_runs_once_but_an_hourly_one_every_real_hour():
    times = fire_times("cron 30 2 * * *", datetime(2026, 10, 24, 12, tzinfo=PARIS), 3)
    assert times == [utc(25, 0, 30, 10), utc(26, 1, 30, 10), utc(27, 1, 30, 10)]  # not 01:30 on the 25th
    hourly = fire_times("cron 0 * * * *", datetime(2026, 10, 25, 1, 30, tzinfo=PARIS), 4)
    assert [t - hourly[0] for t in hourly] == [timedelta(hours=h) for h in range(4)]


def test_an_interval_counts_real_time_from_its_creation_across_dst():
    created = datetime(2026, 10, 24, 23, 30, tzinfo=UTC)
    times = fire_times("every 3600s", created, 5)
    assert times == [created + timedelta(hours=h) for h in range(1, 6)]


@pytest.mark.parametrize(("text", "spec"), [
    ("@daily", "cron 0 0 * * *"), ("@hourly", "cron 0 * * * *"), ("@weekly", "cron 0 0 * * 0"),
    ("cron 15 8 * * 1-5", "cron 15 8 * * 1-5"), ("every 30m", "every 1800s"),
    ("every 2 hours", "every 7200s"), ("once 2026-12-24 08:00", "once 2026-12-24T07:00:00+00:00"),
])
def test_schedules_read(text, spec):
    assert parse_schedule(text, PARIS, NOW).spec == spec


@pytest.mark.parametrize(("text", "says"), [
    ("cron 61 * * * *", "bad cron expression '61 * * * *'"),
    ("cron * * *", "five fields"),
    ("cron 0 8 * * 8", "weekday '8'"),
    ("every 5s", "between 60 s"),
    ("every fortnight", "cannot read the interval"),
    ("once 2020-01-01 08:00", "is past"),
    ("whenever", "cannot read the schedule"),
])
def test_bad_schedules_say_how_to_write_one(text, says):
    with pytest.raises(ScheduleError) as raised:
        parse_schedule(text, PARIS, NOW)
    assert says in str(raised.value)


# ---- the skill, through the executor, on the real book ----------------------------------------

@pytest.fixture
async def book(tmp_path):
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}", clock=lambda: NOW)
    yield Jobs(store, max_live=3)
    await store.close()


def executor(book, tmp_path) -> tuple[Executor, Policy]:
    registry = SkillRegistry()
    registry.add(ScheduleSkill(), "built-in", {"timezone": "Europe/Paris"})
    return Executor(registry, sandbox=None, jobs=book), Policy({}, tmp_path, lambda u: "user")


async def test_add_list_pause_resume_cancel(book, tmp_path):
    run, policy = executor(book, tmp_path)
    ada = policy.principal("telegram:1")
    added = await run.call("schedule", {"action": "add", "kind": "agent", "cron": "0 8 * * 1-5",
                                        "text": "what matters in my inbox?",
                                        "only_if_attention": True}, ada, chat_id="1")
    assert added.ok, added.text
    assert added.text == "Job #1 (agent) scheduled: cron '0 8 * * 1-5': what matters in my inbox?"
    [job] = await book.store.list_jobs("telegram:1")
    assert (job.chat_id, job.timezone, job.options) == ("1", "Europe/Paris", {"only_if_attention": True})
    once = await run.call("schedule", {"action": "add", "when": "tomorrow 9:00", "text": "dentist"},
                          ada, chat_id="1")
    assert once.ok and "#2 (reminder) scheduled: once" in once.text
    assert (await book.store.list_jobs("telegram:1"))[1].schedule == "once 2026-12-01T08:00:00+00:00"

    assert (await run.call("schedule", {"action": "pause", "number": 1}, ada, chat_id="1")).text \
        == "Paused job #1."
    listed = await run.call("schedule", {"action": "list"}, ada, chat_id="1")
    assert listed.text.splitlines()[0] == ("#1 agent, cron '0 8 * * 1-5', paused: "
                                           "what matters in my inbox?")
    assert (await run.call("schedule", {"action": "resume", "number": 1}, ada)).text == "Resumed job #1."
    assert (await run.call("schedule", {"action": "cancel", "number": 2}, ada)).text == "Cancelled job #2."
    again = await run.call("schedule", {"action": "cancel", "number": 2}, ada)
    assert not again.ok and "no active or paused job #2" in again.text


async def test_a_user_sees_and_changes_only_their_own_jobs(book, tmp_path):
    run, policy = executor(book, tmp_path)
    ada, bob = policy.principal("telegram:1"), policy.principal("telegram:2")
    await run.call("schedule", {"action": "add", "every": "1h", "text": "secret"}, ada, chat_id="1")
    theirs = await run.call("schedule", {"action": "list"}, bob, chat_id="2")
    assert theirs.text == "You have no scheduled jobs."
    for action in ("cancel", "pause"):
        refused = await run.call("schedule", {"action": action, "number": 1}, bob, chat_id="2")
        assert not refused.ok and "you have no" in refused.text
    assert [j.status for j in await book.store.list_jobs("telegram:1")] == [JobStatus.ACTIVE]
    # No argument names a user: the model cannot make a job for someone else.
    forged = await run.call("schedule", {"action": "add", "every": "1h", "text": "spam",
                                         "user": "telegram:1"}, bob, chat_id="2")
    assert not forged.ok and "unknown argument 'user'" in forged.text
    assert [j.text for j in await book.store.list_jobs("telegram:1")] == ["secret"]


async def test_bad_arguments_are_tool_errors_and_store_nothing(book, tmp_path):
    run, policy = executor(book, tmp_path)
    ada = policy.principal("telegram:1")
    for args, says in [
        ({"cron": "0 25 * * *"}, "bad cron expression '0 25 * * *'"),
        ({"cron": "0 8 * *"}, "five fields"),
        ({"every": "1s"}, "between 60 s"),
        ({"when": "yesterday-ish"}, "cannot read when="),
        ({}, "exactly one of when (once), cron or every"),
        ({"cron": "@daily", "every": "1h"}, "exactly one of"),
        ({"cron": "@daily", "kind": "heartbeat"}, "must be one of"),
        ({"cron": "@daily", "text": " "}, "needs its text"),
        ({"cron": "@daily", "timezone": "Mars/Olympus"}, "unknown time zone"),
    ]:
        outcome = await run.call("schedule", {"action": "add", "text": "x", **args}, ada, chat_id="1")
        assert not outcome.ok and says in outcome.text, (args, outcome.text)
    assert await book.store.list_jobs("telegram:1") == []


async def test_a_user_has_at_most_max_live_jobs(book, tmp_path):
    run, policy = executor(book, tmp_path)
    ada = policy.principal("telegram:1")
    for _ in range(3):
        assert (await run.call("schedule", {"action": "add", "cron": "@daily", "text": "x"}, ada,
                               chat_id="1")).ok
    refused = await run.call("schedule", {"action": "add", "cron": "@daily", "text": "x"}, ada,
                             chat_id="1")
    assert not refused.ok and "you have 3 jobs already" in refused.text
    assert len(await book.store.list_jobs("telegram:1")) == 3


def test_jobs_command_reads_as_the_skills_call():
    skill = ScheduleSkill()
    assert skill.typed_command("/jobs", "") == {"action": "list"}
    assert skill.typed_command("/jobs", "cancel 3") == {"action": "cancel", "number": 3}
    assert skill.typed_command("/jobs", "pause #2") == {"action": "pause", "number": 2}
    assert skill.typed_command("/jobs", "cancel") == JOBS_USAGE
