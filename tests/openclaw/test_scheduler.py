"""Scheduled jobs in the running daemon: a reminder job and a cron job fire and are delivered, jobs
survive a restart, a run missed while the daemon was down follows its kind's grace (run once,
late; or the user told it was missed), and a due time never runs twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from openclaw.daemon import Daemon
from openclaw.scheduler.book import key_of
from openclaw.scheduler.core import touch_from_elsewhere
from openclaw.store import JobStatus
from tests.helpers.daemon import RecordingConnector, config
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
