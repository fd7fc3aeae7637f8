"""A request to approve a command shows the command exactly as it runs on Discord: the real daemon
with a scripted model that asks for `shell`, the real discord.py client, and the fake Discord, with
a model of how the app renders Markdown (tests/fakes/discord_api/markdown.py). Spoilers (||...||),
styles and a ``` that would close the code block show as typed."""

from __future__ import annotations

import re

import pytest

from openclaw.gateway.contract import literal_block
from tests.connectors import test_discord
from tests.connectors.test_approval_prompts import SHELL_NEEDS_APPROVAL, TRICKY, asks_for
from tests.fakes.discord_api.markdown import HIDDEN, shown
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

ADA = test_discord.ADA
fake, daemon_with = test_discord.fake, test_discord.daemon_with  # the fake Discord, a daemon on it


@pytest.mark.parametrize("command", TRICKY)
async def test_discord_shows_the_command_to_approve_as_it_runs(fake, daemon_with, command):
    await daemon_with(ScriptedModel(asks_for(command)), SHELL_NEEDS_APPROVAL)
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "do it")
    await until(lambda: any("/approve" in t for t in fake.texts(channel)))
    [prompt] = fake.texts(channel)
    header, shown_command, asked = shown(prompt).split("\n")
    assert header == "Approval needed (shell):"
    assert shown_command == f"run the shell command: {command}"
    assert asked.startswith("Reply /approve ")


async def test_a_command_longer_than_a_discord_message_shows_whole_across_its_pieces(
        fake, daemon_with):
    command = " ".join(f"echo ||{i}|| ```" for i in range(300))  # about 4,500 characters
    await daemon_with(ScriptedModel(asks_for(command)), SHELL_NEEDS_APPROVAL)
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "do it")
    await until(lambda: any("/approve" in t for t in fake.texts(channel)))
    pieces = [shown(p) for p in fake.texts(channel)]
    assert len(pieces) >= 3 and not any(HIDDEN in p for p in pieces)
    # Each piece is a block of its own (the chunker closes and reopens it); the answer's line
    # may travel alone.
    asked = re.fullmatch(r"Approval needed \(shell\):\nrun the shell command: (.*?)\n?"
                         r"Reply /approve \d+ to allow it or /deny \d+ to refuse\.", "".join(pieces),
                         re.DOTALL)
    assert asked is not None, pieces
    shown_command = asked[1]
    assert shown_command == command




def test_a_literal_block_cannot_be_closed_from_inside_on_discord():
    text = "a ``` b ||hidden|| ```` c `"
    assert shown(literal_block(text)) == text
