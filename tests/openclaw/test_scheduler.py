"""Scheduled jobs in the running daemon: a reminder job and a cron job fire and are delivered, jobs
survive a restart, a run missed while the daemon was down follows its kind's grace (run once,
late; or the user told it was missed), and a due time never runs twice."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.date import DateTrigger

from openclaw.cli.main import main
from openclaw.config import ConfigError
from openclaw.daemon import Daemon
from openclaw.scheduler.book import key_of
from openclaw.scheduler.core import WAKE_KEY, JobScheduler, touch_from_elsewhere
from openclaw.store import JobStatus
from tests.helpers.daemon import RecordingConnector, config, say
from tests.helpers.daemon import started as started_with
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import eventually, until

SKILLS = """
[skills]
enabled = ["clock", "reminders", "schedule"]
[skills.reminders]
timezone = "UTC"
"""
OWNER = "terminal:local"


def quiet_model() -> ScriptedModel:
    return ScriptedModel(lambda messages: "checked: " + messages[-1]["content"][-40:])


async def started(tmp_path):
    return await started_with(tmp_path, quiet_model(), SKILLS)


def reminders_sent(conn: RecordingConnector) -> list[str]:
    return [t for t in conn.texts() if t.startswith("⏰")]


async def test_a_reminder_job_fires_at_its_time_and_is_delivered_once(tmp_path):
    daemon, conn = await started(tmp_path)
    try:
        due = datetime.now(UTC) + timedelta(seconds=1)
        job = await daemon.scheduling.jobs.add(OWNER, "local", kind="reminder",
                                               schedule=f"once {due.isoformat()}", text="stretch",
                                               timezone="UTC")
        await until(lambda: reminders_sent(conn))
        assert reminders_sent(conn) == ["⏰ Reminder: stretch"]
        assert conn.sent[-1][0] == "local"
        [run] = await daemon.store.job_runs(job.id)
        assert run.outcome == "delivered" and run.due_at == due.replace(microsecond=due.microsecond)
        assert (await daemon.store.get_job(job.id)).status == JobStatus.DONE  # a one-off ends
    finally:
        await daemon.stop()


async def test_a_cron_job_fires_and_keeps_its_cron_times(tmp_path):
    daemon, conn = await started(tmp_path)
    try:
        job = await daemon.scheduling.jobs.add(OWNER, "local", kind="reminder",
                                               schedule="0 8 * * 1-5", text="standup",
                                               timezone="Europe/Paris")
        [listed] = await daemon.scheduling.jobs.list_for(OWNER)
        nxt = listed.next_run
        assert nxt.astimezone(ZoneInfo("Europe/Paris")).hour == 8
        assert nxt.astimezone(UTC).weekday() < 5  # Monday to Friday, as crontab counts
        assert daemon.scheduling.scheduler.run_soon(key_of(job))  # due now, as `run-now` does
        await until(lambda: reminders_sent(conn))
        assert reminders_sent(conn) == ["⏰ Reminder: standup"]
        [again] = await daemon.scheduling.jobs.list_for(OWNER)
        assert again.next_run == nxt and again.job.status == JobStatus.ACTIVE
    finally:
        await daemon.stop()


async def test_jobs_survive_a_restart_and_what_was_missed_follows_the_grace_rule(tmp_path):
    """Down while they were due: an every-minute cron that missed sixty times runs once
    (coalesced); a one-off reminder an hour late is sent, saying it is late (within a reminder's
    grace); an agent job two hours late is not run, and its user is told it was missed."""
    daemon, conn = await started(tmp_path)
    jobs = daemon.scheduling.jobs
    every_minute = await jobs.add(OWNER, "local", kind="reminder", schedule="* * * * *",
                                  text="drink water", timezone="UTC")
    far_hour = (datetime.now(UTC).hour + 12) % 24  # no daily time falls in the two hours down
    agent = await jobs.add(OWNER, "local", kind="agent", schedule=f"0 {far_hour} * * *",
                           text="check the build", timezone="UTC")
    once = await jobs.add(OWNER, "local", kind="reminder", text="call back", timezone="UTC",
                          schedule=f"once {datetime.now(UTC) + timedelta(hours=3):%Y-%m-%d %H:%M}")
    await daemon.stop()
    url = daemon.config.store.url
    now = datetime.now(UTC)
    assert touch_from_elsewhere(url, key_of(once), now - timedelta(hours=1))
    assert touch_from_elsewhere(url, key_of(every_minute), now - timedelta(hours=1))
    assert touch_from_elsewhere(url, key_of(agent), now - timedelta(hours=2))

    conn = RecordingConnector()
    daemon = Daemon(config(tmp_path, SKILLS), model=quiet_model(), connectors=[conn])
    await daemon.start()
    try:
        await until(lambda: len(conn.texts()) >= 3)
        texts = sorted(conn.texts())
        assert texts[0].startswith("I missed your scheduled job #2, due ")
        assert texts[1].startswith("⏰ Reminder: call back\n(It was due ")
        assert texts[2] == "⏰ Reminder: drink water"
        runs = await eventually(lambda: daemon.store.job_runs(every_minute.id), lambda r: r)
        assert [r.outcome for r in runs if r.due_at <= now] == ["delivered"]  # once, not 60 times
        assert [r.outcome for r in await daemon.store.job_runs(agent.id)] == ["missed"]
        assert daemon.model.prompts == []  # the missed agent job never reached the model
        listed = {item.job.id: item for item in await daemon.scheduling.jobs.list_for(OWNER)}
        assert set(listed) == {every_minute.id, agent.id}  # the repeating ones, ahead again
        assert all(item.next_run > now for item in listed.values())
    finally:
        await daemon.stop()


async def test_jobs_command_lists_next_runs_in_the_users_zone_and_cancels_only_ones_own(tmp_path):
    daemon, conn = await started_with(tmp_path, quiet_model(), SKILLS.replace(
        'timezone = "UTC"', 'timezone = "Asia/Tokyo"'), also=(tg := RecordingConnector("telegram"),))
    try:
        await daemon.store.set_user_status("telegram", 5, "allowed")
        mine = await daemon.scheduling.jobs.add(OWNER, "local", kind="reminder", schedule="0 9 * * *",
                                                text="standup", timezone="Asia/Tokyo")
        listed = await say(daemon, conn, "/jobs")
        assert listed.startswith("#1 reminder, cron '0 9 * * *', next ")
        assert listed.endswith(" 09:00 Asia/Tokyo: standup")
        assert await say(daemon, tg, "/jobs", user="5") == "You have no scheduled jobs."
        refused = await say(daemon, tg, "/jobs cancel 1", user="5")
        assert "you have no active or paused job #1; /jobs shows them" in refused
        assert (await daemon.store.get_job(mine.id)).status == JobStatus.ACTIVE
        assert await say(daemon, conn, "/jobs cancel 1") == "Cancelled job #1."
        assert daemon.scheduling.scheduler.next_run(key_of(mine)) is None  # its trigger is gone
    finally:
        await daemon.stop()


def jobs_toml(*entries: tuple[str, str, str]) -> str:
    return "".join(f'\n[[jobs]]\nname = "{name}"\nuser = "{OWNER}"\nschedule = "{schedule}"\n'
                   f'prompt = "{prompt}"\nkind = "reminder"\n' for name, schedule, prompt in entries)


async def test_config_jobs_are_added_changed_and_removed_never_twice(tmp_path):
    def configured(*entries):
        return config(tmp_path, SKILLS + jobs_toml(*entries))

    configured(("water", "@daily", "water the plants"), ("build", "every 2h", "check the build"))
    daemon = Daemon(configured(("water", "@daily", "water the plants"),
                               ("build", "every 2h", "check the build")),
                    model=quiet_model(), connectors=[RecordingConnector()])
    await daemon.start()
    try:
        [water, build] = await daemon.store.list_jobs(OWNER)
        assert (water.config_name, water.schedule, build.schedule) == (
            "water", "cron 0 0 * * *", "every 7200s")
        with pytest.raises(ValueError, match="set by the owner in the config"):
            await daemon.scheduling.jobs.cancel(OWNER, water.number)  # not the user's to cancel
        configured(("water", "0 7 * * *", "water the plants"), ("post", "@weekly", "post the log"))
        outcome = await daemon.reload(notify=False)
        assert outcome.ok and "jobs" in outcome.applied
        jobs = {j.config_name: j for j in await daemon.store.list_jobs(OWNER)}
        assert set(jobs) == {"water", "post"}
        assert jobs["water"].id == water.id and jobs["water"].schedule == "cron 0 7 * * *"
        assert daemon.scheduling.scheduler.next_run(key_of(water)).hour == 7
        assert (await daemon.store.get_job(build.id)).status == JobStatus.CANCELLED
        assert daemon.scheduling.scheduler.next_run(key_of(build)) is None
        await daemon.reload(notify=False)  # the same file again: nothing added
        assert len(await daemon.store.list_jobs(OWNER)) == 2
    finally:
        await daemon.stop()
    daemon = Daemon(configured(("water", "0 7 * * *", "water the plants"),
                               ("post", "@weekly", "post the log")),
                    model=quiet_model(), connectors=[RecordingConnector()])
    await daemon.start()  # a restart reconciles the same entries: still one job each
    try:
        assert sorted(j.config_name for j in await daemon.store.list_jobs(OWNER)) == ["post", "water"]
    finally:
        await daemon.stop()


def test_a_bad_config_job_is_a_config_error_naming_its_key(tmp_path):
    with pytest.raises(ConfigError) as raised:
        config(tmp_path, jobs_toml(("a", "0 25 * * *", "x"), ("b", "@daily", "y"),
                                   ("b", "@hourly", "z"), ("c", "once 2030-01-01 08:00", "w")))
    problems = raised.value.problems
    assert any(p.startswith('jobs[0].schedule = "0 25 * * *": bad cron expression') for p in problems)
    assert any(p.startswith("jobs[3].schedule") and "a [[jobs]] entry repeats" in p for p in problems)
    with pytest.raises(ConfigError) as raised:
        config(tmp_path, jobs_toml(("b", "@daily", "y"), ("b", "@hourly", "z")))
    assert any("jobs[1].name: 'b' is also jobs[0]'s" in p for p in raised.value.problems)


async def test_cli_lists_cancels_and_runs_now_while_the_daemon_runs(tmp_path, capsys):
    daemon, conn = await started(tmp_path)
    cfg = str(tmp_path / "openclaw.toml")

    def cli(*argv: str) -> SimpleNamespace:
        capsys.readouterr()
        code = main(list(argv))
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    try:
        job = await daemon.scheduling.jobs.add(OWNER, "local", kind="reminder", schedule="@weekly",
                                               text="review the week", timezone="UTC")
        other = await daemon.scheduling.jobs.add(OWNER, "local", kind="reminder",
                                                 schedule="@daily", text="tidy", timezone="UTC")
        listed = await asyncio.to_thread(cli, "--config", cfg, "jobs", "list")
        assert listed.returncode == 0
        assert "#1    reminder  cron 0 0 * * 0" in listed.stdout and "next 20" in listed.stdout
        ran = await asyncio.to_thread(cli, "--config", cfg, "jobs", "run-now", OWNER, "1")
        assert ran.returncode == 0, ran.stderr
        daemon.scheduling.scheduler.wake()  # as WAKE_S would, sooner
        await until(lambda: reminders_sent(conn))
        assert reminders_sent(conn) == ["⏰ Reminder: review the week"]
        cancelled = await asyncio.to_thread(cli, "--config", cfg, "jobs", "cancel", OWNER, "#2")
        assert cancelled.returncode == 0 and "cancelled terminal:local's job #2: tidy" in cancelled.stdout
        await daemon.scheduling.follow_tables()  # as the daemon does every WAKE_S
        assert daemon.scheduling.scheduler.next_run(key_of(other)) is None
        assert daemon.scheduling.scheduler.next_run(key_of(job)) is not None
        missing = await asyncio.to_thread(cli, "--config", cfg, "jobs", "cancel", "telegram:9", "1")
        assert missing.returncode == 1 and "has no active or paused job #1" in missing.stderr
    finally:
        await daemon.stop()


async def test_stop_drains_a_run_in_progress_and_cancels_one_that_outlasts_the_drain(tmp_path):
    """SIGTERM's stop: nothing more fires, a run in progress is waited for (up to the drain
    timeout), then cancelled."""
    scheduler = JobScheduler(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    started, release, finished = asyncio.Event(), asyncio.Event(), []

    async def fire(key: str, due: datetime) -> None:
        if key != WAKE_KEY:
            started.set()
            await release.wait()
            finished.append(key)

    for drain_s, released in ((30.0, True), (0.05, False)):
        started.clear()
        release.clear()
        await scheduler.start(fire)
        scheduler.put("job:1", DateTrigger(datetime.now(UTC)))
        await started.wait()
        stopping = asyncio.create_task(scheduler.stop(drain_s))
        if released:
            await asyncio.wait({stopping}, timeout=0.2)
            assert not stopping.done()  # waits for the run
            release.set()
        await stopping
        assert not scheduler.running
    assert finished == ["job:1"]  # the first run ended; the second was cancelled at the drain's end
