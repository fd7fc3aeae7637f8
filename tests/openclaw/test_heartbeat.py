"""Heartbeats (openclaw/scheduler/heartbeat.py): opt-in per user with /heartbeat; an empty
checklist calls no model; quiet hours skip runs; HEARTBEAT.md is read as the sandbox reads files."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from openclaw.scheduler.agent_job import VERDICT_SYSTEM
from openclaw.scheduler.book import key_of
from openclaw.scheduler.heartbeat import HeartbeatSettings, parse_every, parse_quiet
from tests.helpers.daemon import msg
from tests.helpers.scripted_model import ScriptedModel
from tests.openclaw.test_agent_jobs import PLAIN, start

USER = f"telegram:{PLAIN}"


def attentive(messages: list[dict]) -> str:
    """Finds something on any checklist, and says so."""
    if messages[0]["content"] == VERDICT_SYSTEM:
        call = {"name": "verdict", "arguments": {"notify": True, "message": "The build broke."}}
        return "<tool_call>" + json.dumps(call) + "</tool_call>"
    return "The build is red."


async def say(daemon, tele, text: str) -> str:
    await tele.handler(msg(text, user=PLAIN, channel="telegram"))
    await daemon.gateway.wait_idle()
    await daemon.gateway.outbox.settled("telegram", PLAIN)
    return tele.texts(PLAIN)[-1]


async def test_a_heartbeat_over_an_empty_checklist_calls_no_model(tmp_path):
    model = ScriptedModel(attentive)
    daemon, tele = await start(tmp_path, model)
    try:
        beats = daemon.heartbeats
        assert await beats.run(USER) is None  # off by default
        assert "Heartbeat: on, every 30m" in await say(daemon, tele, "/heartbeat on")
        assert await beats.run(USER) is None  # no HEARTBEAT.md
        workspace = daemon.gateway.access.principal(USER).workspace
        (workspace / "HEARTBEAT.md").write_text("  \n\t\n")
        assert await beats.run(USER) is None  # only whitespace
        assert model.prompts == []
        (workspace / "HEARTBEAT.md").write_text("- is the build green?\n")
        assert await beats.run(USER) == "The build broke."
        assert "is the build green?" in str(model.prompts[0])
        # A checklist given in the chat replaces the file's; an empty edit goes back to the file.
        await say(daemon, tele, "/heartbeat edit - did the backup run?")
        await beats.run(USER)
        asked = model.prompts[-2][-1]["content"]  # the turn's own message, not the history
        assert "did the backup run?" in asked and "is the build green?" not in asked
        await say(daemon, tele, "/heartbeat edit")
        await beats.run(USER)
        assert "is the build green?" in model.prompts[-2][-1]["content"]
        await say(daemon, tele, "/heartbeat off")
        calls = len(model.prompts)
        assert await beats.run(USER) is None
        assert len(model.prompts) == calls
    finally:
        await daemon.stop()


async def test_quiet_hours_skip_the_heartbeat_in_the_users_zone(tmp_path):
    model = ScriptedModel(attentive)
    daemon, tele = await start(tmp_path, model)
    try:
        beats = daemon.heartbeats
        await say(daemon, tele, "/heartbeat on")
        await say(daemon, tele, "/heartbeat edit - is the build green?")
        answer = await say(daemon, tele, "/heartbeat quiet 22:00-07:00 Europe/Paris")
        assert "Quiet hours: 22:00-07:00 Europe/Paris" in answer
        for night in ("2026-12-07T21:30:00", "2026-12-07T23:59:00", "2026-12-08T05:59:00"):
            beats.now = lambda at=night: datetime.fromisoformat(at).replace(tzinfo=UTC)
            assert await beats.run(USER) is None  # 22:30, 00:59, 06:59 in Paris
        assert model.prompts == []
        beats.now = lambda: datetime(2026, 12, 8, 6, 0, tzinfo=UTC)  # 07:00 in Paris
        assert await beats.run(USER) == "The build broke."
    finally:
        await daemon.stop()


async def test_a_heartbeat_file_that_is_a_link_is_not_followed(tmp_path):
    model = ScriptedModel(attentive)
    daemon, tele = await start(tmp_path, model)
    try:
        await say(daemon, tele, "/heartbeat on")
        secret = tmp_path / "daemon-secret.txt"
        secret.write_text("token=hunter2")
        workspace = daemon.gateway.access.principal(USER).workspace
        (workspace / "HEARTBEAT.md").symlink_to(secret)  # as a command in the sandbox could
        assert await daemon.heartbeats.run(USER) is None
        assert model.prompts == []
    finally:
        await daemon.stop()


async def test_heartbeat_commands_change_the_schedule_and_bad_input_changes_nothing(tmp_path):
    daemon, tele = await start(tmp_path, ScriptedModel(attentive))
    try:
        changes: list[HeartbeatSettings] = []

        async def on_change(settings: HeartbeatSettings) -> None:
            changes.append(settings)

        daemon.heartbeats.on_change = on_change
        assert "off" in await say(daemon, tele, "/heartbeat")
        await tele.handler(msg("/heartbeat on", user=PLAIN, chat="-500", channel="telegram",
                               is_group=True))
        await daemon.gateway.wait_idle()
        await daemon.gateway.outbox.settled("telegram", "-500")
        assert "only in a private chat" in tele.texts("-500")[-1]
        await say(daemon, tele, "/heartbeat on")
        assert "every 2h" in await say(daemon, tele, "/heartbeat every 2h")
        assert "did not understand" in await say(daemon, tele, "/heartbeat every 1m")
        assert "time zone" in await say(daemon, tele, "/heartbeat quiet 22:00-07:00 Mars/Base")
        await say(daemon, tele, "/heartbeat edit check the mail")  # the checklist: no reschedule
        await say(daemon, tele, "/heartbeat off")
        assert [(c.enabled, c.every_minutes, c.chat_id) for c in changes] == [
            (True, 30, PLAIN), (True, 120, PLAIN), (False, 120, PLAIN)]
        stored = await daemon.heartbeats.settings.get(USER)
        assert (stored.quiet_start, stored.checklist) == (None, "check the mail")
        assert [s.user for s in await daemon.heartbeats.settings.enabled()] == []
    finally:
        await daemon.stop()


def test_intervals_and_quiet_hours_are_read_or_refused():
    assert [parse_every(t) for t in ("30m", "2h", "90 minutes", "4m", "25h", "soon")] == [
        30, 120, 90, None, None, None]
    assert parse_quiet("22:00-7:00") == ("22:00", "07:00", None)
    assert parse_quiet("off") == (None, None, None)
    assert "did not understand" in parse_quiet("25:00-07:00")
    assert "different" in parse_quiet("07:00-07:00")


async def test_heartbeat_on_schedules_one_job_whose_run_delivers_and_off_cancels_it(tmp_path):
    model = ScriptedModel(attentive)
    daemon, tele = await start(tmp_path, model)
    try:
        book, runs = daemon.scheduling.jobs, daemon.scheduling.runs
        await say(daemon, tele, "/heartbeat on")
        await say(daemon, tele, "/heartbeat every 2h")  # the job is replaced, never doubled
        [listed] = await book.list_for(USER)
        assert (listed.job.kind, listed.job.schedule, listed.job.chat_id) == (
            "heartbeat", "every 7200s", PLAIN)
        assert await runs.fire(listed.job.id, daemon.store.now()) == "silent"  # no checklist
        assert model.prompts == []
        await say(daemon, tele, "/heartbeat edit - is the build green?")
        # As the scheduler fires it: a heartbeat is not the schedule skill's (which "user" lacks).
        await daemon.scheduling.fire(key_of(listed.job), daemon.store.now())
        await daemon.gateway.outbox.settled("telegram", PLAIN)
        assert tele.texts(PLAIN)[-1] == "The build broke."
        await say(daemon, tele, "/heartbeat off")
        assert await book.list_for(USER) == []
    finally:
        await daemon.stop()
