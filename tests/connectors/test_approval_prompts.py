"""A request to approve a command shows the command exactly as it runs: the real daemon with a
scripted model that asks for `shell`, the real python-telegram-bot client, and the fake Bot API,
which says what the chat shows (tests/fakes/telegram_api/wire.py). Markdown in a command (`...`,
**...**, ||...||, a ``` that would close the block, HTML) shows as typed. Discord's side:
test_discord_approval_prompts.py."""

from __future__ import annotations

import json

import pytest

from connectors.telegram import markdown_to_html
from openclaw.gateway.contract import literal_block
from tests.fakes.telegram_api.wire import visible_html
from tests.helpers import telegram_env
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.telegram_env import ADA
from tests.helpers.waiting import until

fake, env = telegram_env.fake, telegram_env.env

SHELL_NEEDS_APPROVAL = '[skills]\nenabled = ["shell"]\n[roles.admin]\napproval = ["shell"]\n'
TRICKY = [
    "echo `id` && ls **safe**",
    "echo ok ||rm -rf ~|| done",
    "printf '```\\n' ; echo ||rm -rf ~|| __x__ *y* ~~z~~",
    "cat <b>a</b> &amp; &lt; > x",
    "echo ````` `` ` end`",
]


def asks_for(command: str):
    def reply(messages: list[dict]) -> str:
        if messages[-1]["role"] == "tool":
            return "done"
        call = {"name": "shell", "arguments": {"command": command}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    return reply


@pytest.mark.parametrize("command", TRICKY)
async def test_telegram_shows_the_command_to_approve_as_it_runs(env, fake, command):
    await env.start(ScriptedModel(asks_for(command)), SHELL_NEEDS_APPROVAL)
    fake.send("do it")
    await until(lambda: any(m.buttons for m in fake.bot_messages[ADA]))
    [prompt] = [m for m in fake.bot_messages[ADA] if m.buttons]
    assert prompt.parse_mode == "HTML" and "<pre>" in prompt.text
    header, shown_command, asked = prompt.shown.split("\n")
    assert header == "Approval needed (shell):"
    assert shown_command == f"run the shell command: {command}"
    assert asked.startswith("Reply /approve ")


def test_a_literal_block_renders_on_telegram_as_pre_with_everything_escaped():
    text = "echo `id` && ls **safe** <b> ``` ||x||"
    html = markdown_to_html("Approval needed (shell):\n" + literal_block(text) + "\nReply.")
    assert "<pre>" in html and "\u200b" not in html
    assert visible_html(html) == f"Approval needed (shell):\n{text}\nReply."


async def test_the_pairing_list_shows_a_strangers_name_as_they_wrote_it(env, fake):
    # The owner approves a person by what the list shows: Markdown in a name must not change it.
    name = "`Ada` **(admin)** ||x|| <i>&"
    await env.start(ScriptedModel(lambda m: "hi"))
    fake.send("hello", user=2002, first_name=name)
    await env.replies(2002, 1)
    [told] = await env.replies(ADA, 1)  # the owner is told of the request, the name as written
    assert told.split("\n")[1] == f"telegram user 2002 ({name})", told
    fake.send("/pairing")
    listing = (await env.replies(ADA, 2))[1]
    assert listing.split("\n")[1].endswith(f"telegram:2002  {name}"), listing


async def test_a_request_telegram_cannot_format_goes_as_the_same_plain_text(env, fake):
    command = TRICKY[0]
    await env.start(ScriptedModel(asks_for(command)), SHELL_NEEDS_APPROVAL)
    fake.reject_formatting = True  # every parse_mode refused: the connector sends plain text
    fake.send("do it")
    await until(lambda: any(m.buttons for m in fake.bot_messages[ADA]))
    [prompt] = [m for m in fake.bot_messages[ADA] if m.buttons]
    assert prompt.parse_mode is None
    assert prompt.shown.split("\n")[:2] == ["Approval needed (shell):",
                                            f"run the shell command: {command}"]
