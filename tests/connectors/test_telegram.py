"""The Telegram connector end to end: the real daemon (real SQLite, gateway, agent) with a scripted
model, the real python-telegram-bot client, and a local fake of the Bot API (tests/fakes): DMs,
pairing, groups, long replies, formatting, commands, rate limits, outages, files, media, drafts,
and a daemon killed between storing a message and answering it.

Run as a module (`python -m tests.connectors.test_telegram CONFIG MODE`) it is that daemon as a
process, built from the config like `openclaw run` but with the scripted model, so a test can
SIGKILL it at a chosen moment without paying for the embedded engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from connectors.attachments import safe_file_name
from connectors.telegram import Backoff, TelegramConnector, markdown_to_html
from openclaw.channels import configured_connectors
from openclaw.config import ConfigError, load_config
from openclaw.daemon import Daemon
from openclaw.gateway.contract import ConnectorStartError
from openclaw.store.records import ConversationStatus, OutboundStatus
from tests.fakes.telegram_api import FakeTelegram, Generated
from tests.helpers import telegram_env
from tests.helpers.replies import answers
from tests.helpers.scripted_model import ScriptedModel, echo, history_echo, last_user
from tests.helpers.telegram_env import ADA, Env, write_config
from tests.helpers.waiting import eventually, until

# PTB itself warns, while building a RetryAfter, that retry_after will become a timedelta; the
# connector reads either form, so the notice says nothing about this code.
pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

BOB = 2002  # a stranger
GROUP = -100500
REPO = Path(__file__).resolve().parents[2]

fake, env = telegram_env.fake, telegram_env.env  # a fake Bot API, and a daemon on it (Env)


@pytest.fixture
async def local_env(tmp_path):
    """A local Bot API server in --local mode: getFile names files on this machine."""
    server = FakeTelegram(local_dir=tmp_path / "bot-api")
    await server.start()
    environment = Env(tmp_path, server)
    yield environment
    await environment.stop()
    await server.stop()


# ---- conversations ------------------------------------------------------------------------------


async def test_a_dm_conversation_over_two_turns_is_remembered(env, fake):
    await env.start(ScriptedModel(history_echo))
    fake.send("my name is Ada")
    assert await env.replies(ADA, 1) == ["you said 1 things: my name is Ada"]
    fake.send("what is my name?")
    assert (await env.replies(ADA, 2))[1] == "you said 2 things: my name is Ada | what is my name?"
    assert (ADA, "typing") in fake.actions
    assert [c["command"] for c in fake.commands] == [
        "new", "stop", "status", "help", "approve", "deny", "remind", "reminders", "jobs",
        "heartbeat", "remember", "memory", "audit", "good", "bad", "private", "sh", "run"]
    assert all(c["description"] for c in fake.commands)


async def test_an_unknown_user_gets_a_pairing_code_and_after_approval_a_reply(env, fake):
    model = ScriptedModel(lambda m: "hello friend")
    daemon = await env.start(model)
    fake.send("hi", user=BOB, first_name="Bob")
    [pairing] = await env.replies(BOB, 1)
    [code] = await daemon.store.list_pairing_codes()
    assert code.user == f"telegram:{BOB}" and code.display_name == "Bob"
    assert code.code in pairing and "pairing code" in pairing
    assert model.prompts == []  # nothing reached the model
    assert await daemon.store.approve_pairing(code.code) is not None
    daemon.gateway.welcomes.wake()  # as `openclaw pairing approve` is found: told, "hi" answered
    assert (await env.replies(BOB, 3))[2] == "hello friend"
    fake.send("hi again", user=BOB)
    assert (await env.replies(BOB, 4))[3] == "hello friend"


async def test_start_is_passed_to_the_gateway_which_greets(env, fake):
    await env.start(ScriptedModel(echo))
    fake.send("/start")
    [greeting] = await env.replies(ADA, 1)
    assert greeting.startswith("Hello!") and "/new" in greeting


async def test_in_a_group_only_messages_addressed_to_the_bot_are_answered(env, fake):
    model = ScriptedModel(echo)
    await env.start(model)
    fake.send("just chatting among ourselves", chat=GROUP)
    fake.send(f"@{fake.username}, what is 2+2?", chat=GROUP)
    [first] = await env.replies(GROUP, 1)
    assert first == "re: what is 2+2?"  # the mention is stripped
    bot_message = fake.message(GROUP, fake.bot_messages[GROUP][0].message_id)
    own = fake.send("replying to myself", chat=GROUP)
    fake.send("no bot here either", chat=GROUP, reply_to=own)
    fake.send(f"hi @{fake.username}2", chat=GROUP)  # another bot, whose name starts like ours
    fake.send(f"hey @{fake.username}", user=BOB, chat=GROUP)  # strangers in groups: nothing
    fake.send("and 3+3?", chat=GROUP, reply_to=bot_message)
    assert (await env.replies(GROUP, 2))[1] == "re: and 3+3?"
    fake.send(f"/help@{fake.username}", chat=GROUP)
    assert "/new" in (await env.replies(GROUP, 3))[2]
    assert [last_user(p) for p in model.prompts] == ["what is 2+2?", "and 3+3?"]
    assert fake.texts(BOB) == []


async def test_sh_in_a_group_runs_the_senders_command_and_shows_its_output_literally(env, fake):
    model = ScriptedModel(echo)
    daemon = await env.start(model, '[skills]\nenabled = ["shell"]')
    fake.send(f"/sh@{fake.username} echo '<b>*not bold*</b>'", chat=GROUP)
    [reply] = await env.replies(GROUP, 1)
    assert "exit status 0" in reply and "<b>*not bold*</b>" in reply  # as printed, not formatted
    [row] = await daemon.store.list_audit()
    assert (row.user, row.skill, row.arguments) == (
        f"telegram:{ADA}", "shell", {"command": "echo '<b>*not bold*</b>'"})
    assert model.prompts == []


FORUM, TOPIC = -1009876543210, 42  # a supergroup with topics, and one of its topics


async def test_a_question_in_a_forum_topic_is_answered_in_that_topic_as_its_own_conversation(
        env, fake):
    await env.start(ScriptedModel(history_echo, chunk=4, delay=0.02), "stream_edits = true",
                    draft_interval=0.05)
    fake.send(f"@{fake.username} my name is Ada", chat=FORUM, topic=TOPIC)
    assert await env.replies(FORUM, 1) == ["you said 1 things: my name is Ada"]
    fake.send(f"@{fake.username} what is my name?", chat=FORUM)  # in General: another talk
    assert (await env.replies(FORUM, 2))[1] == "you said 1 things: what is my name?"
    # Each reply, its streamed draft included, is in the topic it answers, not in General.
    assert [m.topic for m in fake.bot_messages[FORUM]] == [TOPIC, None]
    threads = [c.params.get("message_thread_id") for c in fake.calls_to("sendChatAction")]
    assert threads[0] == TOPIC and threads[-1] is None
    fake.send(f"@{fake.username} /new", chat=FORUM, topic=TOPIC)  # only the topic's talk ends
    await env.replies(FORUM, 3)
    fake.send(f"@{fake.username} and now?", chat=FORUM)
    assert (await env.replies(FORUM, 4))[3] == "you said 2 things: what is my name? | and now?"
    assert [m.topic for m in fake.bot_messages[FORUM]][2:] == [TOPIC, None]


async def test_a_10000_character_reply_arrives_in_order_in_pieces_of_at_most_4096(env, fake):
    long = "\n\n".join(f"Paragraph {i}: " + " ".join(f"w{i}.{j}" for j in range(60))
                       for i in range(25))
    assert len(long) == 10_013
    await env.start(ScriptedModel(lambda m: long, chunk=1000))
    fake.send("write a lot")
    await until(lambda: len(fake.texts(ADA)) >= 3)
    await env.daemon.gateway.wait_idle()
    pieces = fake.texts(ADA)
    assert len(pieces) == 3 and all(len(p) <= 4096 for p in pieces)
    assert "\n\n".join(pieces).split() == long.split()  # nothing lost, reordered or repeated


async def test_markdown_is_sent_as_html_and_as_plain_text_when_telegram_cannot_parse_it(env, fake):
    reply = "Use **bold** and `x < y` here:\n```python\nprint('a & b')\n```"
    await env.start(ScriptedModel(lambda m: reply))
    fake.send("format please")
    [shown] = await env.replies(ADA, 1)
    assert fake.bot_messages[ADA][0].parse_mode == "HTML"
    assert shown == "Use bold and x < y here:\nprint('a & b')"
    fake.reject_formatting = True
    fake.send("again")
    assert (await env.replies(ADA, 2))[1] == reply
    assert fake.bot_messages[ADA][1].parse_mode is None
    assert [c.status for c in fake.calls_to("sendMessage")] == [200, 400, 200]


async def test_new_and_stop_commands(env, fake):
    model = ScriptedModel(history_echo)
    await env.start(model)
    fake.send("one")
    assert await env.replies(ADA, 1) == ["you said 1 things: one"]
    fake.send("/new")
    assert (await env.replies(ADA, 2))[1] == "Started a new conversation."
    fake.send("two")
    assert (await env.replies(ADA, 3))[2] == "you said 1 things: two"
    model.gate = asyncio.Event()  # the next reply stalls after its first chunk
    fake.send("tell me everything")
    await until(lambda: len(model.prompts) == 3)
    fake.send("/stop")
    assert (await env.replies(ADA, 4))[3] == "Stopped."
    assert model.aborted


def clock_then_late(messages: list[dict]) -> str:
    """The clock, then an answer; with CLOCK_NEEDS_APPROVAL the call waits for /approve."""
    if messages[-1]["role"] == "tool":
        return "it is late"
    return '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'


CLOCK_NEEDS_APPROVAL = '[roles.admin]\napproval = ["clock"]\n'


async def test_a_tool_call_waiting_for_approval_is_answered_with_a_tap(env, fake):
    await env.start(ScriptedModel(clock_then_late), CLOCK_NEEDS_APPROVAL)
    fake.send("what time is it?")
    await until(lambda: any(m.buttons for m in fake.bot_messages[ADA]))
    [prompt] = [m for m in fake.bot_messages[ADA] if m.buttons]
    assert prompt.shown.startswith("Approval needed (clock)")
    [[approve, deny]] = prompt.buttons
    number = approve["callback_data"].removeprefix("/approve ")
    assert (approve["text"], deny["text"], deny["callback_data"]) == ("Approve", "Deny",
                                                                        f"/deny {number}")
    # A tap that is not one of our buttons' (a modified client) is answered and dropped.
    fake.tap(ADA, prompt.message_id, "/new")
    fake.tap(ADA, prompt.message_id, approve["callback_data"])
    await until(lambda: "it is late" in answers(fake.texts(ADA)))
    texts = fake.texts(ADA)
    assert f"Approved: clock #{number} runs now." in texts
    assert "Started a new conversation." not in texts
    assert len(fake.answered_taps) == 2  # each tap's spinner stopped
    # Only the request's own message has buttons: the answer and the rest do not.
    assert [bool(m.buttons) for m in fake.bot_messages[ADA]].count(True) == 1


async def test_in_a_group_only_the_user_the_call_acts_for_can_approve_it_with_a_tap(env, fake):
    await env.start(ScriptedModel(clock_then_late), CLOCK_NEEDS_APPROVAL)
    fake.send("@openclaw_test_bot what time is it?", user=ADA, chat=GROUP)
    await until(lambda: any(m.buttons for m in fake.bot_messages[GROUP]))
    [prompt] = [m for m in fake.bot_messages[GROUP] if m.buttons]
    [[approve, _]] = prompt.buttons
    fake.tap(GROUP, prompt.message_id, approve["callback_data"], user=BOB, first_name="Bob")
    await until(lambda: len(fake.answered_taps) == 1)  # a stranger's tap: dropped
    fake.tap(GROUP, prompt.message_id, approve["callback_data"], user=ADA)
    await until(lambda: "it is late" in answers(fake.texts(GROUP)))
    texts = fake.texts(GROUP)
    # Ada's tap approved it: had Bob's, hers would have found no request waiting.
    assert sum(t.startswith("Approved: clock") for t in texts) == 1
    assert not any(t.startswith("There is no request") for t in texts), texts


# ---- rate limits, outages, crashes --------------------------------------------------------------


async def test_a_429_on_send_message_delays_the_reply_but_it_arrives(env, fake):
    await env.start(ScriptedModel(echo))
    fake.fail_next("sendMessage", 429, retry_after=1)
    fake.send("hello")
    assert await env.replies(ADA, 1, timeout=15) == ["re: hello"]
    refused, served = fake.calls_to("sendMessage")
    assert (refused.status, served.status) == (429, 200)
    assert served.at - refused.at >= 1.0  # retry_after was honoured


async def test_one_chats_rate_limit_holds_up_no_other_chat(env, fake):
    """A stranger's pairing code, sent while their update is handed over, meets a 429 that asks
    for 8 s: the wait is the outbox's, in the background, so the next update (the owner's) is
    read and answered meanwhile; before, every chat waited the 8 s out behind it."""
    await env.start(ScriptedModel(echo))
    fake.fail_next("sendMessage", 429, retry_after=8)
    fake.send("hi", user=BOB)
    await until(lambda: fake.calls_to("sendMessage"))  # the pairing code met the 429
    fake.send("hello", user=ADA)
    told, answer = await env.replies(ADA, 2)  # the owner is told of the request, then answered
    assert "asks for access" in told and answer == "re: hello"
    assert fake.texts(BOB) == []  # the stranger's code still waits its 8 s out
    await until(lambda: fake.texts(BOB), timeout=20)
    assert "pairing code" in fake.texts(BOB)[0]


async def test_polling_survives_errors_and_the_service_going_away_and_coming_back(env, fake, caplog):
    caplog.set_level(logging.WARNING, logger="connectors.telegram")
    await env.start(ScriptedModel(echo))
    fake.send("first")
    assert await env.replies(ADA, 1) == ["re: first"]
    fake.fail_next("getUpdates", 502, "Bad Gateway")
    fake.fail_next("getUpdates", 429, retry_after=1)
    await fake.stop()  # the network goes away, cutting the long poll
    fake.send("are you there?")  # Telegram keeps it until the bot is back
    await until(lambda: caplog.text.count("polling failed") >= 3)  # reconnecting, with backoff
    await fake.start()
    assert await env.replies(ADA, 2, timeout=15) == ["re: first", "re: are you there?"]
    assert [c.status for c in fake.calls_to("getUpdates")].count(502) == 1


async def test_updates_without_a_message_are_confirmed_and_skipped(env, fake):
    model = ScriptedModel(echo)
    await env.start(model)
    user = {"id": ADA, "is_bot": False, "first_name": "Ada"}
    chat = {"id": ADA, "type": "private", "first_name": "Ada"}
    fake.add_update({"edited_message": {"message_id": 1, "date": 0, "edit_date": 1, "chat": chat,
                                        "from": user, "text": "edited"}})
    fake.add_update({"callback_query": {"id": "7", "from": user, "chat_instance": "c", "data": "x"}})
    member = {"status": "member", "user": {"id": fake.bot_id, "is_bot": True, "first_name": "B"}}
    fake.add_update({"my_chat_member": {"chat": chat, "from": user, "date": 0,
                                        "old_chat_member": {**member, "status": "left"},
                                        "new_chat_member": member}})
    fake.send(chat=GROUP, new_chat_members=[user])  # a service message in a group
    fake.send(None, pinned_message={"message_id": 1, "date": 0, "chat": chat})  # in a DM
    last = fake.add_update({"message": {"message_id": 99, "date": 0, "chat": chat, "from": user,
                                        "text": "still there?"}})
    assert await env.replies(ADA, 1) == ["re: still there?"]
    await until(lambda: fake.confirmed > last)
    assert [last_user(p) for p in model.prompts] == ["still there?"]


async def test_stop_ends_a_long_poll_at_once_and_confirms_what_was_handled(env, fake):
    await env.start(ScriptedModel(echo), poll_timeout=30)
    fake.send("hello")
    await env.replies(ADA, 1)
    await until(lambda: fake.polls_waiting)  # a 30 s long poll is open
    started = time.monotonic()
    await env.stop()
    assert time.monotonic() - started < 3
    assert fake.updates == []  # the handled message was confirmed on the way out


async def test_stop_lets_a_handler_that_began_end_and_confirms_its_update(fake):
    # A stop that came while an update's handler ran (the gateway storing the message, then its
    # feedback check): the handler ends first, so the update is confirmed, not delivered again.
    entered, release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []

    async def handler(message) -> None:
        entered.set()
        await release.wait()
        handled.append(message.text)

    connector = TelegramConnector(fake.token, base_url=fake.base_url,
                                  base_file_url=fake.base_file_url, poll_timeout=5)
    await connector.start(handler)
    fake.send("hello")
    await until(entered.is_set)
    stopping = asyncio.ensure_future(connector.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done()  # it waits for the handler
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert handled == ["hello"] and fake.updates == []


async def test_a_message_refused_while_the_daemon_stops_is_not_confirmed_and_answered_later(
        env, fake, caplog):
    await env.start(ScriptedModel(echo))
    fake.send("first")
    await env.replies(ADA, 1)
    await env.daemon.gateway.drain(1)  # what a SIGTERM does first: the gateway takes no more
    late = fake.send("late")
    await until(lambda: "was not stored" in caplog.text)
    await env.stop()
    assert [u["message"]["message_id"] for u in fake.updates] == [late["message_id"]]
    await env.start(ScriptedModel(echo))
    assert await env.replies(ADA, 2) == ["re: first", "re: late"]


async def test_a_reply_that_cannot_be_sent_is_retried_until_the_service_is_back(env, fake):
    model = ScriptedModel(echo)
    daemon = await env.start(model)
    model.gate = asyncio.Event()
    fake.send("hello")
    await until(lambda: model.prompts)
    await fake.stop()
    model.gate.set()  # the reply is ready while Telegram is unreachable: send_text raises
    await until(lambda: daemon.gateway.outbox.backlog)
    await fake.start()
    await until(lambda: fake.texts(ADA), timeout=15)
    await daemon.gateway.outbox.wait_delivered()
    assert fake.texts(ADA) == ["re: hello"]


async def test_a_reply_telegram_refuses_for_good_is_not_retried(env, fake):
    daemon = await env.start(ScriptedModel(echo))
    fake.fail_next("sendMessage", 403, "Forbidden: bot was blocked by the user")
    fake.send("hello")
    await until(lambda: fake.calls_to("sendMessage"))
    await daemon.gateway.wait_idle()
    assert daemon.gateway.outbox.backlog == 0  # marked failed, no retry scheduled
    assert await daemon.store.pending_outbound() == []
    assert fake.texts(ADA) == []


async def test_a_chat_that_blocked_the_bot_loses_its_reminders_and_others_keep_theirs(env, fake):
    daemon = await env.start(ScriptedModel(echo), '\n[skills]\nenabled = ["clock", "reminders"]')
    now, ada = daemon.store.now(), f"telegram:{ADA}"
    later = await daemon.reminders.add(ada, str(ADA), "call mum", now + timedelta(hours=3),
                                       repeat=None, timezone="UTC")
    in_group = await daemon.reminders.add(ada, str(GROUP), "standup", now + timedelta(hours=1),
                                          repeat="daily", timezone="UTC")
    fake.blocked_by.add(ADA)
    await daemon.reminders.add(ada, str(ADA), "pills", now, repeat="daily", timezone="UTC")
    await until(lambda: fake.calls_to("sendMessage"))  # the daily one fires and is refused
    await eventually(lambda: daemon.store.active_reminders(),
                     lambda active: [r.id for r in active] == [in_group.id])
    assert await daemon.store.pending_outbound() == [] and daemon.gateway.outbox.backlog == 0
    assert later.id != in_group.id and fake.texts(ADA) == []


@pytest.mark.parametrize("description", [
    "Bad Request: message is too long",  # this message, not the chat
    "Bad Request: not enough rights to send text messages to the chat",  # restricted, for a while
])
async def test_a_refusal_of_one_message_leaves_the_chats_reminders_alone(env, fake, description):
    daemon = await env.start(ScriptedModel(echo), '\n[skills]\nenabled = ["clock", "reminders"]')
    daily = await daemon.reminders.add(f"telegram:{ADA}", str(ADA), "pills",
                                       daemon.store.now() + timedelta(hours=1), repeat="daily",
                                       timezone="UTC")
    fake.fail_next("sendMessage", 400, description)
    fake.send("hello")
    await until(lambda: fake.calls_to("sendMessage"))
    await daemon.gateway.wait_idle()
    assert [r.id for r in await daemon.store.active_reminders()] == [daily.id]


async def test_a_group_upgraded_to_a_supergroup_takes_its_reminders_along(env, fake):
    daemon = await env.start(ScriptedModel(echo), REMINDERS)
    now, ada = daemon.store.now(), f"telegram:{ADA}"
    later = await daemon.reminders.add(ada, str(BASIC_GROUP), "standup", now + timedelta(hours=1),
                                       repeat="daily", timezone="UTC")
    fake.migrate(BASIC_GROUP, SUPERGROUP, announce=False)  # only the refusal tells
    await daemon.reminders.add(ada, str(BASIC_GROUP), "now", now, repeat=None, timezone="UTC")
    await eventually(lambda: daemon.store.active_reminders(),
                     lambda active: [(r.id, r.chat_id) for r in active] == [(later.id, str(SUPERGROUP))])
    assert await env.replies(SUPERGROUP, 1) == ["⏰ Reminder: now"]  # the refused one, re-sent


# ---- a group upgraded to a supergroup -----------------------------------------------------------
# Its id changes. Telegram refuses the old id with the new one (ChatMigrated), and tells the bot
# in both chats with a service message; either has the chat's state follow it.

BASIC_GROUP, SUPERGROUP = -4001, -1001234567890
REMINDERS = '\n[skills]\nenabled = ["clock", "reminders"]'


def to_bot(text: str, fake: FakeTelegram) -> str:
    return f"@{fake.username} {text}"


async def conversation_in(daemon: Daemon, chat: int) -> int:
    return (await daemon.store.active_conversation(f"telegram:{ADA}", str(chat), "telegram")).id


async def talk_in_the_group(env: Env, fake: FakeTelegram):
    """Ada told the bot her name in the basic group, which has a daily reminder: (the daemon, its
    model, the reminder, the group's conversation id)."""
    model = ScriptedModel(history_echo)
    daemon = await env.start(model, REMINDERS)
    standup = await daemon.reminders.add(f"telegram:{ADA}", str(BASIC_GROUP), "standup",
                                         daemon.store.now() + timedelta(hours=1), repeat="daily",
                                         timezone="UTC")
    fake.send(to_bot("my name is Ada", fake), chat=BASIC_GROUP)
    assert await env.replies(BASIC_GROUP, 1) == ["you said 1 things: my name is Ada"]
    return daemon, model, standup, await conversation_in(daemon, BASIC_GROUP)


async def test_the_reply_refused_by_an_upgraded_group_arrives_in_the_supergroup_and_the_talk_goes_on(
        env, fake):
    daemon, model, standup, conversation = await talk_in_the_group(env, fake)
    model.gate = asyncio.Event()  # the next answer is being written when the group is upgraded
    fake.send(to_bot("what is my name?", fake), chat=BASIC_GROUP)
    await until(lambda: len(model.prompts) == 2)
    fake.migrate(BASIC_GROUP, SUPERGROUP, announce=False)  # no service message: only the refusal
    model.gate.set()
    assert await env.replies(SUPERGROUP, 1) == ["you said 2 things: my name is Ada | what is my name?"]
    assert [c.status for c in fake.calls_to("sendMessage")] == [200, 400, 200]
    # Marked sent just after Telegram answered, which the fake has already shown: look until then.
    expected = [(str(BASIC_GROUP), OutboundStatus.SENT), (str(SUPERGROUP), OutboundStatus.SENT)]
    sent: list = []

    async def outbound_states():
        nonlocal sent
        sent = await daemon.store.list_outbound()
        return [(o.chat_id, o.status) for o in sent]

    deadline = asyncio.get_running_loop().time() + 10
    while await outbound_states() != expected:
        assert asyncio.get_running_loop().time() < deadline, [(o.chat_id, o.status) for o in sent]
        await asyncio.sleep(0.01)
    assert sent[1].external_message_id == str(fake.bot_messages[SUPERGROUP][0].message_id)
    fake.send(to_bot("and now?", fake), chat=SUPERGROUP)
    assert (await env.replies(SUPERGROUP, 2))[1] == (
        "you said 3 things: my name is Ada | what is my name? | and now?")
    assert await conversation_in(daemon, SUPERGROUP) == conversation
    assert [(r.id, r.chat_id) for r in await daemon.store.active_reminders()] == [
        (standup.id, str(SUPERGROUP))]


async def test_the_service_messages_alone_move_the_group_and_its_waiting_reply(env, fake, caplog):
    caplog.set_level(logging.WARNING, logger="openclaw.gateway")
    daemon, _, standup, conversation = await talk_in_the_group(env, fake)
    # The next reply fails for a while and waits for a retry far off: only the move sends it.
    daemon.gateway.outbox.first_delay_s = 600
    fake.fail_next("sendMessage", 502, "Bad Gateway")
    fake.send(to_bot("what is my name?", fake), chat=BASIC_GROUP)
    await until(lambda: daemon.gateway.outbox.backlog)
    fake.migrate(BASIC_GROUP, SUPERGROUP)
    assert await env.replies(SUPERGROUP, 1) == ["you said 2 things: my name is Ada | what is my name?"]
    assert [c.status for c in fake.calls_to("sendMessage")] == [200, 502, 200]  # nothing refused
    await until(lambda: not fake.updates)  # both service messages handled and confirmed
    assert caplog.text.count(f"telegram chat {BASIC_GROUP} is now {SUPERGROUP}") == 1  # not twice
    fake.send(to_bot("and now?", fake), chat=SUPERGROUP)
    assert (await env.replies(SUPERGROUP, 2))[1].startswith("you said 3 things: my name is Ada")
    assert await conversation_in(daemon, SUPERGROUP) == conversation
    assert [(r.id, r.chat_id) for r in await daemon.store.active_reminders()] == [
        (standup.id, str(SUPERGROUP))]
    assert fake.texts(BASIC_GROUP) == ["you said 1 things: my name is Ada"]


async def test_a_message_the_stop_left_unanswered_is_answered_in_the_supergroup_after_restart(
        env, fake):
    _, model, _, conversation = await talk_in_the_group(env, fake)
    model.gate = asyncio.Event()  # never set: the answer is still being written at the stop
    fake.send(to_bot("what is my name?", fake), chat=BASIC_GROUP)
    await until(lambda: len(model.prompts) == 2)
    fake.migrate(BASIC_GROUP, SUPERGROUP)
    await until(lambda: not fake.updates)  # both service messages handled: the chat has moved
    await env.stop()  # the turn is aborted; the message stays stored, unanswered
    model.gate = None
    daemon = await env.start(model, REMINDERS)
    assert await env.replies(SUPERGROUP, 1) == ["you said 2 things: my name is Ada | what is my name?"]
    assert [c.status for c in fake.calls_to("sendMessage")] == [200, 200]  # the old id never tried
    assert await conversation_in(daemon, SUPERGROUP) == conversation


async def test_a_move_noticed_late_keeps_the_groups_history_over_a_talk_begun_in_the_supergroup(
        env, fake):
    daemon, _, _, conversation = await talk_in_the_group(env, fake)
    fake.migrate(BASIC_GROUP, SUPERGROUP, announce=False)  # the service messages never came
    fake.send(to_bot("hello", fake), chat=SUPERGROUP)
    assert await env.replies(SUPERGROUP, 1) == ["you said 1 things: hello"]  # a new conversation
    begun = await conversation_in(daemon, SUPERGROUP)
    # A reminder for the old id is refused: now the group's conversation moves, and wins.
    await daemon.reminders.add(f"telegram:{ADA}", str(BASIC_GROUP), "tea", daemon.store.now(),
                               repeat=None, timezone="UTC")
    assert (await env.replies(SUPERGROUP, 2))[1] == "⏰ Reminder: tea"
    fake.send(to_bot("what is my name?", fake), chat=SUPERGROUP)
    assert (await env.replies(SUPERGROUP, 3))[2] == (
        "you said 2 things: my name is Ada | what is my name?")
    assert await conversation_in(daemon, SUPERGROUP) == conversation != begun
    assert (await daemon.store.get_conversation(begun)).status is ConversationStatus.ARCHIVED


def _serve(config_path: str, mode: str) -> None:
    """The daemon process for the kill test: connectors from the config, a scripted model whose
    reply never finishes in mode "hang"."""
    async def main() -> None:
        config = load_config(Path(config_path))
        model = ScriptedModel(echo)
        if mode == "hang":
            model.gate = asyncio.Event()  # never set: the reply stalls after its first chunk
        daemon = Daemon(config, model=model,
                        connectors=configured_connectors(config))
        await daemon.start()
        await daemon.run_until_stopped(drain_timeout=2)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(main())


def _spawn(config: Path, mode: str, log_file: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.Popen([sys.executable, "-m", "tests.connectors.test_telegram", str(config), mode],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=log_file.open("ab"))


async def test_an_update_redelivered_after_a_kill_is_answered_exactly_once(tmp_path, fake):
    """Killed after storing a message but before confirming it (the confirming poll got a 429)
    and before replying: the restarted daemon gets the update again and answers once."""
    config, log_file = write_config(tmp_path, fake), tmp_path / "daemon.log"
    first = _spawn(config, "hang", log_file)
    try:
        await until(lambda: fake.polls_waiting, timeout=60)
        fake.fail_next("getUpdates", 429, retry_after=30)  # the poll after "hello": unconfirmed
        hello = fake.send("hello")
        await until(lambda: any(c.status == 429 for c in fake.calls_to("getUpdates")))
        first.kill()  # the handler returned (it is stored); no reply yet
        assert first.wait(10) == -signal.SIGKILL
    finally:
        first.kill()
    assert [u["message"]["message_id"] for u in fake.updates] == [hello["message_id"]]
    assert fake.texts(ADA) == []
    second = _spawn(config, "echo", log_file)
    try:
        await until(lambda: fake.texts(ADA), timeout=60)
        fake.send("ping")  # same conversation lane: a second "re: hello" would come first
        await until(lambda: len(fake.texts(ADA)) >= 2)
        assert fake.texts(ADA) == ["re: hello", "re: ping"], log_file.read_text()[-3000:]
        # the update came again, and the gateway knew it by its id (recovery answered it)
        assert f"ignoring redelivered message telegram:{ADA}:{hello['message_id']}" in log_file.read_text()
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0, log_file.read_text()[-3000:]
    finally:
        second.kill()
    assert fake.updates == []  # everything confirmed
    assert "123456:TEST" not in log_file.read_text()  # the token never reaches the log


# ---- files and media ----------------------------------------------------------------------------


async def test_a_document_is_saved_in_the_workspace_and_the_agent_is_told_its_path(env, fake):
    model = ScriptedModel(echo)
    await env.start(model)
    fake.send_document("../../etc/.report v1.pdf", b"%PDF first", caption="summarise this")
    assert await env.replies(ADA, 1) == [
        "re: summarise this\n\n[attached files, in your workspace: report v1.pdf]"]
    fake.send_document("report v1.pdf", b"%PDF second")
    assert (await env.replies(ADA, 2))[1] == "re: [attached files, in your workspace: report v1-1.pdf]"
    principal = env.config.policy().principal(f"telegram:{ADA}")
    workspace = principal.workspace
    assert (workspace / "report v1.pdf").read_bytes() == b"%PDF first"  # never overwritten
    assert (workspace / "report v1-1.pdf").read_bytes() == b"%PDF second"
    assert sorted(p.name for p in workspace.iterdir()) == ["report v1-1.pdf", "report v1.pdf"]
    if os.geteuid() == 0:  # written by a root daemon, owned by the uid the user's commands run as
        assert {(p.stat().st_uid, p.stat().st_gid) for p in workspace.iterdir()} == {
            (principal.scope.uid, principal.scope.uid)}


@pytest.mark.parametrize("sent_as, saved_as", [
    (". .bashrc", "bashrc"), (".. ..", "document-uF1"), (" . . .profile ", "profile")])
async def test_a_document_named_with_dots_and_spaces_is_never_saved_hidden(env, fake, sent_as,
                                                                            saved_as):
    await env.start(ScriptedModel(echo))
    fake.send_document(sent_as, b"echo pwned", caption="keep this")
    [reply] = await env.replies(ADA, 1)
    assert reply == f"re: keep this\n\n[attached files, in your workspace: {saved_as}]"
    workspace = env.config.policy().principal(f"telegram:{ADA}").workspace
    assert [p.name for p in workspace.iterdir()] == [saved_as]


async def test_a_document_is_not_downloaded_into_a_workspace_at_its_quota(env, fake):
    await env.start(ScriptedModel(echo), "[roles.admin]\ndisk_mb = 1")
    workspace = env.config.policy().principal(f"telegram:{ADA}").workspace
    (workspace / "old.bin").write_bytes(os.urandom(2 << 20))
    fake.send_document("new.pdf", b"%PDF", caption="keep this")
    [reply] = await env.replies(ADA, 1)
    assert reply.startswith("re: keep this\n\n[The user sent a file, which was not saved: the "
                            "workspace is full: 2.0 MB used of its 1 MB quota"), reply
    assert fake.calls_to("getFile") == []
    assert sorted(p.name for p in workspace.iterdir()) == ["old.bin"]
    (workspace / "old.bin").unlink()  # room again: the next one is saved
    fake.send_document("new.pdf", b"%PDF")
    assert (await env.replies(ADA, 2))[1] == "re: [attached files, in your workspace: new.pdf]"


async def test_a_strangers_document_is_never_downloaded(env, fake):
    await env.start(ScriptedModel(echo))
    fake.send_document("payload.bin", b"x" * 100, user=BOB)
    assert "pairing code" in (await env.replies(BOB, 1))[0]
    assert fake.calls_to("getFile") == []


async def test_a_document_too_big_is_not_downloaded_and_the_agent_is_told(env, fake):
    await env.start(ScriptedModel(echo), max_file_bytes=10)
    fake.send_document("big.bin", b"x" * 11)
    [reply] = await env.replies(ADA, 1)
    assert "'big.bin'" in reply and "too big" in reply
    assert fake.calls_to("getFile") == []


async def test_a_large_document_streams_in_byte_for_byte(env, fake):
    content = os.urandom(5 * 65536 + 123)  # many chunks, the last one short
    await env.start(ScriptedModel(echo))
    fake.send_document("data.bin", content)
    assert await env.replies(ADA, 1) == ["re: [attached files, in your workspace: data.bin]"]
    workspace = env.config.policy().principal(f"telegram:{ADA}").workspace
    assert (workspace / "data.bin").read_bytes() == content
    [download] = fake.downloads
    assert download.complete and download.sent == len(content)


async def test_a_document_served_larger_than_getfile_said_is_cut_off_at_the_limit(env, fake):
    # The message and getFile say 5 bytes; the server streams 256 MiB. The transfer must end
    # soon after the limit (64 KiB): the connection is closed, not read to the end.
    full = 256 << 20
    await env.start(ScriptedModel(echo), max_file_bytes=65536)
    fake.send_document("big.bin", Generated(full), declared_size=5)
    [reply] = await env.replies(ADA, 1, timeout=30)
    assert reply == ("re: [The user sent the file 'big.bin', too big for me to download: it is over "
                     "the limit of 65536 bytes.]")
    assert len(fake.calls_to("getFile")) == 1
    await until(lambda: fake.downloads and fake.downloads[0].ended)
    [download] = fake.downloads
    # what the server got out before the client closed: the limit, plus what the socket buffers
    # took in (a few MiB; at most 36 MiB here: tcp_rmem's and tcp_wmem's maximum)
    assert not download.complete and 65536 < download.sent < full // 4, download.sent
    assert list(env.tmp_path.rglob("big.bin")) == []


@pytest.mark.parametrize(("status", "reason", "note"), [
    (404, "Not Found", "Telegram no longer has it (404 Not Found: its download link expired, or the "
                       "file is gone); ask the user to send the file again."),
    (502, "Bad Gateway", "Telegram's file server failed (502 Bad Gateway); ask the user to send the "
                         "file again later."),
])
async def test_a_file_server_error_is_a_note_that_names_no_token(env, fake, caplog, status, reason,
                                                                   note):
    caplog.set_level(logging.DEBUG)
    await env.start(ScriptedModel(echo))
    fake.fail_next("download", status, reason)
    fake.send_document("gone.pdf", b"%PDF gone", caption="read this")
    [reply] = await env.replies(ADA, 1)
    assert reply == f"re: read this\n\n[The user sent the file 'gone.pdf', but downloading it failed: {note}]"
    assert [d.status for d in fake.downloads] == [status]
    assert list(env.tmp_path.rglob("gone.pdf")) == []
    assert "could not download gone.pdf" in caplog.text  # the failure was logged...
    assert not [r for r in caplog.records if fake.token in r.getMessage()]  # ...without the token
    assert fake.token not in caplog.text


@pytest.mark.parametrize(("stall", "error"), [(False, "ClientPayloadError"),
                                              (True, "SocketTimeoutError")])
async def test_a_download_broken_off_or_stalled_is_a_note_and_no_file(env, fake, caplog, stall,
                                                                       error):
    caplog.set_level(logging.DEBUG)
    await env.start(ScriptedModel(echo), file_read_timeout=0.5)
    fake.cut_next_download(100_000, stall=stall)
    fake.send_document("half.bin", b"y" * 300_000)
    [reply] = await env.replies(ADA, 1, timeout=15)
    assert reply.startswith("re: [The user sent the file 'half.bin', but downloading it failed: the "
                            f"connection to Telegram's file server failed ({error}"), reply
    assert list(env.tmp_path.rglob("half.bin")) == []
    assert fake.token not in caplog.text and fake.token not in reply


async def test_a_file_in_a_message_recovered_after_a_restart_is_downloaded(env, fake):
    model = ScriptedModel(echo)
    model.gate = asyncio.Event()  # the first answer never ends: the daemon stops in the middle
    daemon = await env.start(model)
    fake.send("first")
    await until(lambda: model.prompts)
    fake.send_document("notes.txt", b"hello", caption="second")
    await until(lambda: daemon.gateway.queue_length() == 2)  # stored, waiting behind "first"
    await env.stop()
    assert fake.downloads == []
    # The restarted connector's getMe is refused (at start, and by the polling loop, which then
    # waits 2 s): the recovered turns run meanwhile, and the file is fetched with the bot not yet
    # initialized (the download needs no more).
    for _ in range(2):
        fake.fail_next("getMe", 429, retry_after=2)
    await env.start(ScriptedModel(echo))
    assert await env.replies(ADA, 2, timeout=15) == [
        "re: first", "re: second\n\n[attached files, in your workspace: notes.txt]"]
    refused, accepted = fake.calls_to("getMe")[-2:]
    assert refused.status == 429 and fake.calls_to("getFile")[0].at < accepted.at
    workspace = env.config.policy().principal(f"telegram:{ADA}").workspace
    assert (workspace / "notes.txt").read_bytes() == b"hello"


async def test_the_download_session_is_closed_at_stop(env, fake):
    daemon = await env.start(ScriptedModel(echo))
    fake.send_document("a.txt", b"a")
    await env.replies(ADA, 1)
    [connector] = daemon.connectors
    session = connector._files._session
    assert session is not None and not session.closed  # the download used it
    await env.stop()
    assert session.closed


async def test_a_local_bot_api_servers_file_is_copied_from_its_folder(local_env):
    fake = local_env.fake
    content = os.urandom(3 << 20)  # several reads
    await local_env.start(ScriptedModel(echo), max_file_bytes=4 << 20)
    fake.send_document("local.bin", content)
    assert await local_env.replies(ADA, 1) == ["re: [attached files, in your workspace: local.bin]"]
    workspace = local_env.config.policy().principal(f"telegram:{ADA}").workspace
    assert (workspace / "local.bin").read_bytes() == content
    assert fake.downloads == []  # read from the disk, not over HTTP
    fake.send_document("huge.bin", Generated(5 << 20), declared_size=5)
    assert (await local_env.replies(ADA, 2))[1] == (
        "re: [The user sent the file 'huge.bin', too big for me to download: it is over the limit "
        f"of {4 << 20} bytes.]")
    assert list(workspace.glob("huge*")) == []


async def test_a_local_servers_file_missing_here_is_a_note_that_names_no_path(local_env, caplog):
    caplog.set_level(logging.DEBUG)
    fake = local_env.fake
    await local_env.start(ScriptedModel(echo))
    fake.send_document("far.txt", b"far away")
    for path in (local_env.tmp_path / "bot-api").rglob("file_*"):  # on the server's machine only
        path.unlink()
    [reply] = await local_env.replies(ADA, 1)
    assert reply == ("re: [The user sent the file 'far.txt', but downloading it failed: the local "
                     "Bot API server keeps its files on its own machine (--local mode), out of this "
                     "daemon's reach; run the daemon where it can read them, or the server without "
                     "--local]")
    assert fake.downloads == [] and fake.token not in caplog.text


async def test_voice_notes_and_photos_are_answered_as_not_supported_yet(env, fake):
    model = ScriptedModel(echo)
    await env.start(model)
    fake.send_voice()
    [voice] = await env.replies(ADA, 1)
    assert voice == ("Sorry, I cannot open a voice note yet: I read text messages and documents. "
                     "Please type your message.")
    fake.send_photo(caption="what is this?")
    photo = (await env.replies(ADA, 2))[1]
    assert "a photo" in photo and photo.endswith("what is this?")  # the caption still counts
    fake.send_voice(user=BOB)
    assert "pairing code" in (await env.replies(BOB, 1))[0]  # access control as for text
    assert len(model.prompts) == 1  # only the captioned photo reached the model


def test_file_names_are_made_safe():
    assert safe_file_name("../../etc/passwd", "f") == "passwd"
    assert safe_file_name("..\\..\\boot.ini", "f") == "boot.ini"
    assert safe_file_name("..", "fallback") == "fallback"
    assert safe_file_name(".bashrc", "f") == "bashrc"
    assert safe_file_name("a\x00b\nc.txt", "f") == "abc.txt"
    long = safe_file_name("é" * 300 + ".tar.gz", "f")
    assert long.endswith(".gz") and len(long.encode()) <= 120


def test_markdown_to_html_escapes_everything_else():
    assert markdown_to_html("a < b & **c** `<i>`") == "a &lt; b &amp; <b>c</b> <code>&lt;i&gt;</code>"
    assert markdown_to_html("```sh\nrm -rf **x**\n```") == (
        '<pre><code class="language-sh">rm -rf **x**</code></pre>')
    assert markdown_to_html("**unclosed and 2*3") == "**unclosed and 2*3"


# ---- streaming and configuration ----------------------------------------------------------------


async def test_a_streamed_reply_is_one_message_edited_at_most_once_per_interval(env, fake):
    text = " ".join(f"word{i}" for i in range(60))
    model = ScriptedModel(lambda m: text, chunk=25, delay=0.05)
    await env.start(model, "stream_edits = true", draft_interval=0.25)
    fake.send("stream please")
    assert await env.replies(ADA, 1) == [text]  # one message: the draft became the reply
    edits = fake.calls_to("editMessageText")
    drafts = [c for c in edits if c.params.get("parse_mode") is None]
    assert drafts and edits[-1].params.get("parse_mode") == "HTML"  # the final edit is formatted
    sends = [fake.calls_to("sendMessage")[0], *drafts]
    gaps = [b.at - a.at for a, b in zip(sends, sends[1:], strict=False)]
    assert all(gap >= 0.2 for gap in gaps), gaps  # 0.25 s apart, minus timer slack
    assert len({c.params["text"] for c in drafts}) == len(drafts)  # no edit repeats its text


def test_the_config_builds_the_connector_and_refuses_webhooks(tmp_path, fake):
    config = load_config(write_config(tmp_path, fake))
    [connector] = configured_connectors(config)
    assert isinstance(connector, TelegramConnector) and connector.max_message_len == 4096
    assert connector._max_file_bytes == 20 * 2**20
    [connector] = configured_connectors(load_config(write_config(tmp_path, fake, "max_file_mb = 2000")))
    assert connector._max_file_bytes == 2000 * 2**20  # a self-hosted Bot API server's limit
    with pytest.raises(ConfigError, match="telegram.max_file_mb"):
        load_config(write_config(tmp_path, fake, "max_file_mb = 0"))
    path = write_config(tmp_path, fake, 'webhook_url = "https://example.org/hook"')
    with pytest.raises(ConfigError, match="telegram.webhook_url.*long polling"):
        configured_connectors(load_config(path))


async def test_a_rejected_token_stops_the_start_without_printing_the_token(fake):
    connector = TelegramConnector("999:wrong-token", base_url=fake.base_url, base_file_url=fake.base_file_url)

    async def handler(message) -> None:
        raise AssertionError("no message expected")

    with pytest.raises(ConnectorStartError, match="telegram.token") as raised:
        await connector.start(handler)
    assert "wrong-token" not in str(raised.value) and raised.value.__cause__ is None



async def test_a_token_rejected_after_an_outage_stops_polling_and_is_never_logged(fake, caplog):
    secret = "424242:SECRET-token-value-xyz"
    await fake.stop()  # the service is down when the daemon starts
    connector = TelegramConnector(secret, base_url=fake.base_url, base_file_url=fake.base_file_url,
                                  backoff=Backoff(0.05, 0.1))

    async def handler(message) -> None:
        raise AssertionError("no message expected")

    await connector.start(handler)  # not fatal: it keeps trying in the background
    await fake.start()  # back, but it does not know this token
    try:
        await until(lambda: "polling stopped" in caplog.text, timeout=10)
        await asyncio.sleep(0.3)
        assert caplog.text.count("polling stopped") == 1  # it gave up instead of retrying for ever
        assert "SECRET-token" not in caplog.text and not connector.connected
    finally:
        await connector.stop()


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])


async def test_a_reply_to_a_topic_deleted_meanwhile_is_sent_to_the_chat_instead(env, fake):
    # A reply waiting in the outbox, or a reminder set in a topic, outlives the topic: Telegram
    # then refuses the thread ("message thread not found"), not the chat. The chat still gets it
    # (in General, where every reply went before topics were told apart), not nobody.
    daemon = await env.start(ScriptedModel(echo))
    fake.fail_next("sendMessage", 400, "Bad Request: message thread not found")
    fake.send(f"@{fake.username} hello", chat=FORUM, topic=TOPIC)
    assert await env.replies(FORUM, 1) == ["re: hello"]
    assert [m.topic for m in fake.bot_messages[FORUM]] == [None]
    assert await daemon.store.pending_outbound() == []
