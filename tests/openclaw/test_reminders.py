"""Reminders in the running daemon: set by the model's tool call, delivered into the chat at their
time, added to the conversation, sent late (and saying so) after a restart, moved ahead when they
repeat, never delivered to a user who lost access, and never in the middle of a turn."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from connectors.console_socket import ConsoleSocketConnector, attach
from openclaw.daemon import Daemon
from openclaw.reminders import message, next_time
from openclaw.store import Reminder, ReminderStatus, Store
from skills.builtin.reminders import REMINDERS_USAGE
from tests.helpers.daemon import RecordingConnector, config, msg, say
from tests.helpers.daemon import started as started_with
from tests.helpers.replies import answer
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import eventually, until

SKILLS = """
[skills]
enabled = ["clock", "reminders"]
[skills.reminders]
timezone = "UTC"
"""


def remembering_model():
    """'remind ...' makes one reminders call (arguments after 'remind' as JSON); anything else is
    answered with the conversation as the model saw it, one 'role: content' per line."""
    def reply(messages: list[dict]) -> str:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        tools = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
        if tools:
            return "OK: " + tools[-1]
        text = messages[last_user]["content"]
        if text.startswith("remind "):
            call = {"name": "reminders", "arguments": {"action": "add", **json.loads(text[7:])}}
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages[1:])
    return ScriptedModel(reply)


async def started(tmp_path, model, extra: str = "") -> tuple[Daemon, RecordingConnector]:
    return await started_with(tmp_path, model, SKILLS + extra)


def reminders_sent(conn: RecordingConnector) -> list[str]:
    return [t for t in conn.texts() if t.startswith("⏰")]


async def test_a_reminder_set_in_chat_arrives_there_and_joins_the_conversation(tmp_path):
    daemon, conn = await started(tmp_path, remembering_model())
    try:
        await conn.handler(msg('remind {"text": "stretch", "when": "in 1 second"}'))
        await until(lambda: reminders_sent(conn))
        set_reply = answer(conn.texts()[-2])
        assert set_reply.startswith("OK: Reminder #1 set for ") and "(in 1 s): stretch" in set_reply
        assert reminders_sent(conn) == ["⏰ Reminder: stretch"]
        assert conn.sent[-1][0] == "local"  # the chat it was set from

        await conn.handler(msg("what happened?"))
        await daemon.gateway.wait_idle()
        seen = conn.texts()[-1].splitlines()
        assert seen[-2:] == ["assistant: ⏰ Reminder: stretch", "user: what happened?"]
        assert await daemon.store.active_reminders() == []  # a one-off is done once delivered
    finally:
        await daemon.stop()


async def test_what_fell_due_while_down_is_sent_at_start_late_and_repeats_move_ahead(tmp_path):
    cfg = config(tmp_path, SKILLS)
    (tmp_path / "data").mkdir()
    now = datetime.now(UTC)
    async with await Store.open(cfg.store.url) as store:
        missed = await store.add_reminder("terminal:local", "local", "water the plants",
                                          now - timedelta(hours=3), timezone="UTC")
        daily = await store.add_reminder("terminal:local", "local", "pills",
                                         now - timedelta(days=3, hours=1), repeat="daily", timezone="UTC")
        pending = await store.ensure_user("terminal", "stranger")  # never admitted (pending)
        stranger = await store.add_reminder(pending.key, "stranger", "secret", now - timedelta(minutes=1))
        await store.set_user_status("telegram", 5, "allowed")
        elsewhere = await store.add_reminder("telegram:5", "5", "no telegram here", now, timezone="UTC")
        # Never admitted, on a channel not running: dropped at once, not kept waiting for it.
        nobody = await store.add_reminder("telegram:6", "6", "who?", now, timezone="UTC")

    conn = RecordingConnector()
    daemon = Daemon(cfg, model=remembering_model(), connectors=[conn])
    await daemon.start()
    try:
        await until(lambda: len(reminders_sent(conn)) == 2)
        late = {t.splitlines()[0]: t for t in reminders_sent(conn)}
        assert set(late) == {"⏰ Reminder: water the plants", "⏰ Reminder: pills"}
        assert "I could not send it then" in late["⏰ Reminder: water the plants"]
        assert f"Reminder #{daily.number} repeats daily" in late["⏰ Reminder: pills"]

        await until(lambda: daemon.gateway.queue_length() == 0)
        # Dropping the two who may not be reminded takes the scheduler a few store calls.
        await eventually(lambda: daemon.store.active_reminders(), lambda active: len(active) == 2)
        active = {r.id: r for r in await daemon.store.active_reminders()}
        assert missed.id not in active and stranger.id not in active and nobody.id not in active
        assert active[elsewhere.id].fired_count == 0  # waits for its channel
        moved = active[daily.id]
        assert moved.fired_count == 1 and now < moved.due_at <= now + timedelta(days=1)
        assert (moved.due_at - daily.due_at) % timedelta(days=1) == timedelta(0)
        cancelled = await daemon.store.cancel_reminder(pending.key, stranger.number)
        assert cancelled is None  # already cancelled, by the daemon
        assert all("secret" not in t for t in conn.texts())
    finally:
        await daemon.stop()


async def test_a_reminder_due_during_a_turn_waits_for_it_and_survives_stop(tmp_path):
    model = remembering_model()
    daemon, conn = await started(tmp_path, model)
    try:
        model.gate = asyncio.Event()  # the next answer streams one chunk, then waits
        await conn.handler(msg("tell me a long story"))
        await until(lambda: daemon.gateway.queue_length() == 1 and model.prompts)
        await daemon.reminders.add("terminal:local", "local", "tea", datetime.now(UTC),
                                   repeat=None, timezone="UTC")
        await until(lambda: daemon.gateway.queue_length() == 2)  # queued behind the turn
        assert reminders_sent(conn) == []

        await conn.handler(msg("/stop"))
        await until(lambda: reminders_sent(conn))
        assert "Stopped." in conn.texts()
        model.gate.set()
        model.gate = None
        await conn.handler(msg("and now?"))
        await daemon.gateway.wait_idle()
        seen = conn.texts()[-1].splitlines()
        assert seen[-3:] == ["user: tell me a long story", "assistant: ⏰ Reminder: tea",
                             "user: and now?"]
    finally:
        await daemon.stop()


def reminder(due: datetime, repeat: str | None, zone: str = "Europe/Paris",
             local_time: str | None = None) -> Reminder:
    local_time = local_time or due.astimezone(ZoneInfo(zone)).time().isoformat()
    return Reminder(id=7, number=3, user="telegram:1", channel="telegram", chat_id="1", text="pills",
                    due_at=due, repeat=repeat, timezone=zone, local_time=local_time,
                    status=ReminderStatus.ACTIVE, fired_count=0, created_at=due, fired_at=None)


def test_a_daily_reminder_in_the_dst_gap_hour_comes_back_to_its_time():
    # 02:30 in Paris; on Sunday 29 March 2026 there is no 02:30 (02:00 -> 03:00).
    due, seen = datetime(2026, 3, 27, 1, 30, tzinfo=UTC), []
    for _ in range(4):
        due = next_time(reminder(due, "daily", local_time="02:30:00"), due)
        seen.append(f"{due.astimezone(ZoneInfo('Europe/Paris')):%a %H:%M}")
    assert seen == ["Sat 02:30", "Sun 03:30", "Mon 02:30", "Tue 02:30"]


def test_a_daily_reminder_keeps_its_wall_clock_time_across_dst():
    eight_winter = datetime(2026, 3, 28, 7, 0, tzinfo=UTC)  # Saturday 08:00 in Paris (UTC+1)
    nxt = next_time(reminder(eight_winter, "daily"), eight_winter)
    assert nxt == datetime(2026, 3, 29, 6, 0, tzinfo=UTC)  # Sunday 08:00 in summer time (UTC+2)


@pytest.mark.parametrize(("repeat", "now", "expected"), [
    # Friday 08:00 Paris, fired on time: the next weekday is Monday
    ("weekdays", datetime(2026, 12, 4, 7, 0, tzinfo=UTC), datetime(2026, 12, 7, 7, 0, tzinfo=UTC)),
    ("weekly", datetime(2026, 12, 4, 7, 0, tzinfo=UTC), datetime(2026, 12, 11, 7, 0, tzinfo=UTC)),
    # down for ten days: the next time still ahead, not a backlog of missed ones
    ("daily", datetime(2026, 12, 14, 9, 0, tzinfo=UTC), datetime(2026, 12, 15, 7, 0, tzinfo=UTC)),
    (None, datetime(2026, 12, 4, 7, 0, tzinfo=UTC), None),
])
def test_next_times(repeat, now, expected):
    assert next_time(reminder(datetime(2026, 12, 4, 7, 0, tzinfo=UTC), repeat), now) == expected


def test_a_late_delivery_says_when_it_was_due_in_the_users_zone():
    due = datetime(2026, 12, 4, 7, 0, tzinfo=UTC)
    assert message(reminder(due, None), due + timedelta(seconds=30)) == "⏰ Reminder: pills"
    late = message(reminder(due, None), due + timedelta(hours=2))
    assert late == ("⏰ Reminder: pills\n(It was due Fri 04 Dec 08:00 Europe/Paris; I could not "
                    "send it then.)")


def test_a_repeating_reminder_names_the_users_number_not_the_internal_id():
    due = datetime(2026, 12, 4, 7, 0, tzinfo=UTC)
    assert message(reminder(due, "daily"), due) == (
        "⏰ Reminder: pills\n(Reminder #3 repeats daily; ask me to cancel it to stop it.)")


async def test_reminders_stop_when_the_skill_is_no_longer_the_users(tmp_path):
    cfg = config(tmp_path, SKILLS)
    (tmp_path / "data").mkdir()
    async with await Store.open(cfg.store.url) as store:
        daily = await store.add_reminder("terminal:local", "local", "pills",
                                         datetime.now(UTC) - timedelta(hours=1), repeat="daily")
    conn = RecordingConnector()  # restarted with the skill disabled: no way left to cancel it
    daemon = Daemon(config(tmp_path, '[skills]\nenabled = ["clock"]\n'), model=remembering_model(),
                    connectors=[conn])
    await daemon.start()
    try:
        # The scheduler picks it up at start.
        assert await eventually(lambda: daemon.store.active_reminders(), lambda active: not active) == []
        assert await daemon.store.cancel_reminder("terminal:local", daily.number) is None  # done so
        assert reminders_sent(conn) == []
    finally:
        await daemon.stop()


async def test_a_failed_conversation_write_does_not_hold_the_reminder_back(tmp_path, monkeypatch):
    daemon, conn = await started(tmp_path, remembering_model())
    context = daemon.gateway.agent.context
    real_add = context.add

    async def add(conversation_id, role, content, **kw):
        if content.startswith("⏰"):
            raise RuntimeError("database is locked")
        return await real_add(conversation_id, role, content, **kw)

    monkeypatch.setattr(context, "add", add)
    try:
        await daemon.reminders.add("terminal:local", "local", "tea", datetime.now(UTC),
                                   repeat=None, timezone="UTC")
        await until(lambda: reminders_sent(conn))
        assert reminders_sent(conn) == ["⏰ Reminder: tea"]
        await eventually(lambda: daemon.store.pending_outbound(), lambda pending: not pending)
    finally:
        await daemon.stop()


async def test_stop_while_a_reminder_is_delivered_has_nothing_to_stop(tmp_path, monkeypatch):
    daemon, conn = await started(tmp_path, remembering_model())
    gateway, release, calls = daemon.gateway, asyncio.Event(), []
    real = gateway.due.why_not

    async def held(user):  # checked when due, then again in the lane: held there
        calls.append(user)
        if len(calls) > 1:
            await release.wait()
        return await real(user)

    monkeypatch.setattr(gateway.due, "why_not", held)
    try:
        await daemon.reminders.add("terminal:local", "local", "tea", datetime.now(UTC),
                                   repeat=None, timezone="UTC")
        await until(lambda: any(lane.reminding for lane in gateway.lanes.by_key.values()))
        await conn.handler(msg("/stop"))
        await until(lambda: conn.texts())
        release.set()
        await until(lambda: reminders_sent(conn))
        assert conn.texts() == ["Nothing to stop.", "⏰ Reminder: tea"]
    finally:
        await daemon.stop()


async def test_a_headless_daemons_reminder_waits_for_a_console_to_attach(tmp_path):
    daemon = Daemon(config(tmp_path, SKILLS), model=remembering_model())
    sock = tmp_path / "openclaw.sock"
    console = ConsoleSocketConnector(sock, lambda: daemon.gateway.wait_idle("terminal"))
    daemon.connectors.append(console)
    await daemon.start()
    # A held reminder is tried again after a minute (POLL_S), or as soon as a console attaches:
    # the attach below must not wait for the poll.
    assert daemon.reminders.poll_s == 60
    try:
        with pytest.raises(ConnectionError):  # a reply nobody would see is not "sent"
            await console.send_text("local", "anyone?")
        added = await daemon.reminders.add("terminal:local", "local", "call the dentist",
                                           datetime.now(UTC), repeat=None, timezone="UTC")
        await until(lambda: added.id in daemon.reminders.held)  # tried, and held back
        await asyncio.sleep(0.3)
        [waiting] = await daemon.store.active_reminders()
        assert waiting.fired_count == 0 and await daemon.store.list_outbound() == []

        seen: list[str] = []
        lines = iter(["what happened?\n"])

        async def next_line() -> str:
            await until(lambda: any("⏰" in t for t in seen))  # type the line once it arrived
            return next(lines, "")

        await attach(sock, next_line, seen.append, interactive=False)
        assert any("⏰ Reminder: call the dentist" in t for t in seen)
        assert await daemon.store.active_reminders() == []
    finally:
        await daemon.stop()


async def test_remind_and_reminders_commands_work_without_the_model(tmp_path):
    model = remembering_model()
    daemon, conn = await started(tmp_path, model)
    try:
        async def command(text: str) -> str:
            before = len(conn.sent)
            await conn.handler(msg(text))
            await until(lambda: len(conn.sent) > before)
            return conn.sent[before][1]

        assert (await command("/remind stretch")).startswith("Tell me when and what")
        set_ = await command("/remind me in 2 hours to water the plants")
        assert set_.startswith("Reminder #1 set for ") and set_.endswith("(in 2 h): water the plants")
        assert (await command("/remind someday soon call Bob")).startswith("Tell me when and what")
        assert "is in the past" in await command("/remind 2020-01-01 09:00 old news")
        listed = await command("/reminders")
        assert listed.splitlines()[1].endswith("UTC: water the plants")
        assert await command("/reminders cancel 1") == "Cancelled reminder #1: water the plants"
        assert await command("/reminders cancel #1") == \
            "you have no active reminder #1; /reminders shows them"
        for unclear in ("/reminders cancel", "/reminders cancel abc", "/reminders delete 1"):
            assert await command(unclear) == REMINDERS_USAGE  # not the list
        assert model.prompts == []  # all of it without the model
        adds = [a for a in await daemon.store.list_audit() if a.arguments.get("action") == "add"]
        # Audited like a model's calls: the refused one (newest first) with why.
        assert [(a.skill, a.user) for a in adds] == [("reminders", "terminal:local")] * 2
        assert "in the past" in adds[0].detail and adds[1].detail is None
        # Asked of the person who typed it, not of "the user" as the model is.
        assert await command("/remind at 9 dentist") == (
            "'9' could be 9am or 9pm: which one? Write '9am' or '9pm' (or '21:00')")
    finally:
        await daemon.stop()


async def test_each_user_has_their_own_reminder_numbers_in_commands(tmp_path):
    daemon, conn = await started(tmp_path, remembering_model())
    try:
        await daemon.store.set_user_status("terminal", "bob", "allowed")
        assert (await say(daemon, conn, "/remind in 1 hour tea")).startswith("Reminder #1 set")
        assert (await say(daemon, conn, "/remind in 2 hours cake", user="bob")).startswith(
            "Reminder #1 set")
        assert await say(daemon, conn, "/reminders cancel 1", user="bob") == "Cancelled reminder #1: cake"
        assert "no active reminder #1" in await say(daemon, conn, "/reminders cancel 1", user="bob")
        [left] = await daemon.store.active_reminders()
        assert (left.user, left.number, left.text) == ("terminal:local", 1, "tea")
        assert (await say(daemon, conn, "/remind in 3 hours pie", user="bob")).startswith(
            "Reminder #2 set")  # #1 is not given again
    finally:
        await daemon.stop()


async def test_remind_tells_the_owner_how_to_enable_the_skill_and_others_to_ask(tmp_path):
    daemon, conn = await started_with(tmp_path, remembering_model())  # skills as by default
    try:
        await daemon.store.set_user_status("terminal", "bob", "allowed")
        assert await say(daemon, conn, "/remind in 5 minutes tea") == (
            'The reminders skill is not enabled: add "reminders" to [skills] enabled in the config, '
            "then run `openclaw reload`.")
        assert await say(daemon, conn, "/reminders", user="bob") == (
            "Reminders are not available to you (the owner can enable the reminders skill).")
    finally:
        await daemon.stop()
    # A chat that runs the daemon in its terminal: `openclaw reload` would refuse it.
    conn = RecordingConnector()
    daemon = Daemon(config(tmp_path), model=remembering_model(), connectors=[conn],
                    hangup_reloads=False)
    await daemon.start()
    try:
        assert await say(daemon, conn, "/remind in 5 minutes tea") == (
            'The reminders skill is not enabled: add "reminders" to [skills] enabled in the config, '
            "then restart `openclaw chat`, which runs the daemon in its terminal.")
    finally:
        await daemon.stop()


async def test_remind_names_the_role_that_lacks_the_skill(tmp_path):
    daemon, conn = await started(tmp_path, remembering_model(), '[roles.user]\nskills = ["clock"]\n')
    try:
        await daemon.store.set_user_status("terminal", "bob", "allowed")
        assert await say(daemon, conn, "/remind in 5 minutes tea", user="bob") == (
            "Your role (user) does not include reminders; the owner can add it to [roles.user] skills.")
        assert (await say(daemon, conn, "/remind in 5 minutes tea")).startswith("Reminder #1 set")
    finally:
        await daemon.stop()


async def test_a_reminder_due_on_a_channel_not_enabled_is_said_once_in_the_log(tmp_path, caplog):
    daemon, _ = await started(tmp_path, remembering_model())
    try:
        await daemon.store.set_user_status("telegram", 777, "allowed")
        due = await daemon.store.add_reminder("telegram:777", "777", "tea", daemon.store.now(),
                                              timezone="UTC")
        caplog.set_level("DEBUG", logger="openclaw.gateway")
        for _ in range(3):  # as the scheduler looks again and again
            assert not await daemon.gateway.remind(due)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warnings == [
            f"reminder id {due.id} is due but cannot be sent: the telegram channel is not enabled in "
            f"the config; enable [telegram] and restart, or cancel it with `openclaw reminders "
            f"cancel telegram:777 {due.number}`"]
        assert [r.id for r in await daemon.store.active_reminders()] == [due.id]  # still waits
    finally:
        await daemon.stop()


async def test_a_remind_stored_before_a_crash_is_not_set_twice(tmp_path):
    cfg = config(tmp_path, SKILLS)
    (tmp_path / "data").mkdir()
    async with await Store.open(cfg.store.url) as store:  # stored; maybe also set, then a crash
        await store.set_user_status("terminal", "local", "allowed")
        await store.record_inbound("terminal", "c1", "terminal:local", "local", "/remind in 1 hour tea")
    daemon = Daemon(cfg, model=remembering_model(), connectors=[conn := RecordingConnector()])
    await daemon.start()
    try:
        await until(lambda: conn.texts())
        assert conn.texts()[0].startswith("I restarted before answering your /remind")
        assert await daemon.store.active_reminders() == []
        assert await daemon.store.pending_inbound() == []  # answered, not left for the next start
    finally:
        await daemon.stop()


async def test_stop_right_after_a_reminder_is_added_does_not_hang(tmp_path):
    # The add wakes the scheduler as stop() cancels it: on Python 3.11, asyncio.wait_for loses
    # that cancel, and the scheduler (and so the daemon's stop) went on forever.
    daemon, _ = await started(tmp_path, remembering_model())
    await asyncio.sleep(0.5)  # the scheduler has read the (empty) table and waits for a wake
    await daemon.reminders.add("terminal:local", "local", "later", daemon.store.now() + timedelta(hours=1),
                               repeat=None, timezone="UTC")
    await asyncio.wait_for(daemon.stop(), 10)
