"""The daemon on `[engine] backend = "openai"` as people meet it, against the fake OpenAI server:
a tool that needs approval waits for /approve on Telegram and then runs, and replies stream into
a draft edited in place (Telegram) or printed as they come (the console)."""

from __future__ import annotations

import json

import pytest

from connectors.console_socket import attach
from openclaw.cli.chat import console_connector
from openclaw.daemon import Daemon
from tests.fakes.openai_api import Reply, replies
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers.daemon import config
from tests.helpers.replies import answers
from tests.helpers.telegram_env import ADA, Env
from tests.helpers.waiting import until

from .test_daemon_on_a_server import on

pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

CLOCK_NEEDS_APPROVAL = '[roles.admin]\napproval = ["clock"]\n'
STORY = " ".join(f"word{i}" for i in range(40))


@pytest.fixture
async def telegram():
    """A fake Bot API (`fake` is the model's server)."""
    server = FakeTelegram()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def env(tmp_path, telegram):
    """A daemon with a Telegram connector on `telegram`, started by the test."""
    environment = Env(tmp_path, telegram)
    yield environment
    await environment.stop()


async def test_a_tool_needing_approval_waits_for_approve_and_then_runs(env, telegram, fake):
    fake.reply = replies(Reply(tool_calls=[("clock", {"timezone": "UTC"})]), "It is late in UTC.")
    await env.start(None, CLOCK_NEEDS_APPROVAL + on(fake))
    telegram.send("what time is it?")
    await until(lambda: any(m.buttons for m in telegram.bot_messages[ADA]))
    [prompt] = [m for m in telegram.bot_messages[ADA] if m.buttons]
    assert prompt.shown.startswith("Approval needed (clock)")
    assert len(fake.chats) == 1  # the turn waits, the server is not asked again meanwhile
    number = prompt.buttons[0][0]["callback_data"].removeprefix("/approve ")
    telegram.send(f"/approve {number}")
    await until(lambda: "It is late in UTC." in answers(telegram.texts(ADA)))
    assert f"Approved: clock #{number} runs now." in telegram.texts(ADA)
    call, result = fake.chats[1]["messages"][-2:]
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"timezone": "UTC"}
    # The clock ran (its output, not a refusal) and its result answers the call by id.
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert "UTC" in result["content"] and not result["content"].startswith("error")


async def test_a_reply_streams_into_a_telegram_draft_edited_in_place(env, telegram, fake):
    fake.reply = lambda body: Reply(STORY, chunk=12, delay=0.03)
    await env.start(None, "stream_edits = true\n" + on(fake), draft_interval=0.1)
    telegram.send("tell me a story")
    assert await env.replies(ADA, 1) == [STORY]  # one message: the draft became the reply
    drafts = [c.params["text"] for c in telegram.calls_to("editMessageText")
              if c.params.get("parse_mode") is None]
    first = telegram.calls_to("sendMessage")[0].params["text"]
    # Sent while the server still streamed, then edited as more came: each a longer start of it.
    assert first != STORY and STORY.startswith(first)
    assert drafts and all(STORY.startswith(d) for d in drafts)
    assert len(set(drafts)) == len(drafts)


async def test_a_reply_streams_to_the_console_as_it_comes(tmp_path, fake):
    fake.reply = lambda body: Reply(STORY, chunk=12, delay=0.03)
    daemon = Daemon(config(tmp_path, on(fake)), model=None)
    sock = tmp_path / "openclaw.sock"
    daemon.connectors.append(console_connector(sock, daemon))  # as `openclaw run` makes it
    await daemon.start()
    pieces: list[str] = []
    try:
        assert await attach(sock, feeder(["tell me a story\n"]), pieces.append, interactive=True)
    finally:
        await daemon.stop()
    assert "".join(pieces) == STORY + "\n"
    assert len([p for p in pieces if p.strip()]) > 1  # in pieces, as the server sent them


def feeder(lines: list[str]):
    pending = iter(lines)

    async def next_line() -> str:
        return next(pending, "")

    return next_line

