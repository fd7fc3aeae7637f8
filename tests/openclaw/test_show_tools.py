"""[agent] show_tools: the chat shows a line for each tool call the agent makes (brief), also its
arguments and the first lines of its result (full), or nothing (off); in the streamed draft where
the connector edits one in place, before the reply elsewhere. The model never sees them."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest

from connectors.terminal import TerminalConnector
from openclaw.daemon import Daemon
from openclaw.gateway.tool_lines import tool_line
from openclaw.store.records import OutboundStatus
from skills.executor import Outcome
from tests.helpers import telegram_env
from tests.helpers.daemon import config, say, started
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.telegram_env import ADA
from tests.helpers.waiting import until

pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

fake, env = telegram_env.fake, telegram_env.env

CLOCK = '<tool_call>{"name": "clock", "arguments": {"timezone": "UTC"}}</tool_call>'
LINE = "🔧 clock: UTC — ok"


def clock_then_answer(messages: list[dict]) -> str:
    """A clock call for each user message, then an answer once its result is in."""
    return "It is late." if messages[-1]["role"] == "tool" else CLOCK


async def two_turns(tmp_path, mode: str | None) -> tuple[list[str], list[list[dict]]]:
    """The replies to two messages that each make the model call the clock, and its prompts."""
    model = ScriptedModel(clock_then_answer)
    tmp_path.mkdir(exist_ok=True)
    daemon, conn = await started(tmp_path, model, f'show_tools = "{mode}"' if mode else "")
    try:
        replies = [await say(daemon, conn, "what time is it?"), await say(daemon, conn, "and now?")]
    finally:
        await daemon.stop()
    return replies, model.prompts


async def test_brief_is_the_default_and_puts_a_line_per_call_before_the_reply(tmp_path):
    replies, _ = await two_turns(tmp_path, None)
    assert replies == [f"{LINE}\n\nIt is late."] * 2


async def test_full_also_shows_the_arguments_and_the_first_lines_of_the_result(tmp_path):
    replies, prompts = await two_turns(tmp_path, "full")
    line, block, answer = replies[0].split("\n", 1)[0], replies[0], replies[0].rsplit("\n\n", 1)[1]
    assert line == LINE and answer == "It is late."
    result = next(m["content"] for m in prompts[1] if m["role"] == "tool")
    assert '{"timezone": "UTC"}' in block and result.splitlines()[0] in block
    assert "```" in block  # a literal block: the result's text shows as it is


async def test_off_shows_nothing_and_no_mode_changes_what_the_model_reads(tmp_path):
    replies, off = await two_turns(tmp_path / "off", "off")
    assert replies == ["It is late."] * 2
    for mode in ("brief", "full"):
        _, shown = await two_turns(tmp_path / mode, mode)
        # The second turn's prompts hold the first turn's history: no tool line in there either.
        assert len(shown) == len(off) == 4 and _without_clock(shown) == _without_clock(off)
        assert not any("🔧" in str(m["content"]) for p in shown for m in p)


def _without_clock(prompts: list[list[dict]]) -> str:
    """The prompts with the clock's results and the call ids blanked (they change between runs)."""
    blanked = [[{**m, "content": "" if m["role"] == "tool" else m["content"]} for m in p]
               for p in prompts]
    return re.sub(r"call_[0-9a-f]+", "call", json.dumps(blanked))


async def test_the_reply_is_stored_with_its_lines_so_a_resend_after_a_crash_has_them(tmp_path):
    model = ScriptedModel(clock_then_answer)
    daemon, conn = await started(tmp_path, model)
    try:
        await say(daemon, conn, "what time is it?")
        [row] = [o for o in await daemon.store.list_outbound() if o.inbound_event_id is not None]
        assert row.text == f"{LINE}\n\nIt is late." and row.status == OutboundStatus.SENT
    finally:
        await daemon.stop()


def test_a_line_sums_the_arguments_up_visibly_and_says_how_the_call_ended():
    shell = tool_line("brief", "shell", {"command": "ls -la\n" + "x" * 80 + "\u202e"},
                      Outcome("exit status 0", True, "allowed", exit_status=0))
    assert shell.startswith("🔧 shell: ls -la x") and shell.endswith("… — exit 0")
    assert len(shell.split(": ", 1)[1].split(" — ")[0]) == 60 and "\n" not in shell
    denied = tool_line("brief", "files", {"action": "read", "path": "a\u202eb"},
                       Outcome("error: denied: no", False, "denied"))
    assert denied == "🔧 files: action=read path=a\\u202eb — denied"
    assert tool_line("brief", "x", {}, Outcome("error: boom", False, "allowed")) == "🔧 x — error"
    assert tool_line("off", "x", {}, Outcome("", True, "allowed")) is None


async def test_on_telegram_the_line_shows_in_the_draft_which_becomes_the_reply(env, fake):
    def reply(messages):
        return "It is late, as the clock says." if messages[-1]["role"] == "tool" else CLOCK
    await env.start(ScriptedModel(reply, chunk=6, delay=0.05), "stream_edits = true",
                    draft_interval=0.05)
    fake.send("what time is it?")
    final = f"{LINE}\n\nIt is late, as the clock says."
    assert await env.replies(ADA, 1) == [final]  # one message, edited in place
    [first] = fake.calls_to("sendMessage")
    assert first.params["text"].startswith(LINE)  # the draft shows the line from its start
    edits = [c.params["text"] for c in fake.calls_to("editMessageText")]
    assert all(e.startswith(LINE) for e in edits) and any(LINE + "\n\nIt is" in e for e in edits)


async def test_on_the_terminal_the_line_streams_once_and_the_reply_follows_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # the prompts
    screen = io.StringIO()
    terminal = TerminalConnector(stdin=io.StringIO("what time is it?\n"), stdout=screen,
                                 interactive=True)
    seen: list[str] = []  # the screen as the model is asked again, after the call

    def reply(messages: list[dict]) -> str:
        seen.append(screen.getvalue())
        return clock_then_answer(messages)
    model = ScriptedModel(reply)
    daemon = Daemon(config(tmp_path), model=model, connectors=[terminal])
    await daemon.start()
    try:
        await until(lambda: model.prompts)
        await until(lambda: "It is late." in screen.getvalue())
        await daemon.gateway.wait_idle()
    finally:
        await daemon.stop()
    assert seen == ["", LINE]  # shown as the call ended, before the answer
    assert screen.getvalue() == f"{LINE}\n\nIt is late.\n"  # the draft, continued: nothing twice
