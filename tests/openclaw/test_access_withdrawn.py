"""Access withdrawn while a turn runs (`openclaw users block|revoke` from another process): the turn
runs no further tool, asks the model nothing more and answers nothing; the message is marked failed.
Real daemon, real SQLite file, the real users CLI; a scripted model."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

import pytest

from openclaw.cli import users as users_cli
from openclaw.daemon import Daemon
from openclaw.store import InboundStatus
from skills.base import Skill, SkillContext
from tests.helpers.daemon import RecordingConnector, config, msg
from tests.helpers.replies import answers
from tests.helpers.scripted_model import ScriptedModel

USER = "4242"  # a Telegram user admitted through the store (as pairing does)
CHANNEL = "telegram"  # the terminal has no user but the console, whom the config admits

SKILLS = """
[skills]
enabled = ["clock", "tests.openclaw.test_access_withdrawn:UsersCommand"]
[skills.users_command]
config = "{config}"
[roles.user]
skills = ["clock", "users_command"]
"""


class UsersCommand(Skill):
    """Runs `openclaw users ACTION <the caller>` as the admin would from a shell, with its own
    store connection, while the turn that called it is still running."""

    name = "users_command"
    description = "Test only: openclaw users allow|block|revoke on the caller."
    parameters = {"type": "object", "properties": {"action": {"type": "string"}},
                  "required": ["action"]}

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        return [] if set(settings) == {"config"} else ["config: the config file is needed"]

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        command = argparse.Namespace(config=ctx.settings["config"], user=ctx.user, action=args["action"])
        status = await asyncio.to_thread(users_cli.cmd_users_set, command)  # it runs its own loop
        return f"openclaw users {args['action']}: exit status {status}"


def call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def two_tools(action: str, one_step: bool):
    """The model calls users_command(action), then clock: both in one answer, or one per step;
    then it answers with what the tools said."""
    def reply(messages: list[dict]) -> str:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        results = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
        if not results:
            first = call("users_command", {"action": action})
            return first + call("clock", {}) if one_step else first
        if len(results) == 1:
            return call("clock", {})
        return "done: " + " | ".join(results)
    return reply


async def started(tmp_path, model: ScriptedModel) -> tuple[Daemon, RecordingConnector]:
    path = tmp_path / "openclaw.toml"
    conn = RecordingConnector()
    conn.name = CHANNEL
    daemon = Daemon(config(tmp_path, SKILLS.format(config=path)), model=model, connectors=[conn])
    await daemon.start()
    await daemon.store.set_user_status(CHANNEL, USER, "allowed")
    return daemon, conn


async def outcome(daemon: Daemon, message_id: str) -> tuple[InboundStatus, str | None]:
    """The stored status of an inbound message (recording it again returns the stored row)."""
    event, is_new = await daemon.store.record_inbound(CHANNEL, message_id, f"{CHANNEL}:{USER}",
                                                      USER, "")
    assert not is_new
    return event.status, event.error


async def ran(daemon: Daemon) -> list[tuple[str, str]]:
    return [(a.skill, a.decision) for a in reversed(await daemon.store.list_audit())]


@pytest.mark.parametrize(("action", "one_step"), [("block", True), ("block", False), ("revoke", False)])
async def test_a_turn_stops_when_access_is_withdrawn_during_a_tool(tmp_path, caplog, action, one_step):
    caplog.set_level(logging.INFO, logger="openclaw.gateway")
    model = ScriptedModel(two_tools(action, one_step))
    daemon, conn = await started(tmp_path, model)
    try:
        await conn.handler(msg("check the time", user=USER, mid="m-withdrawn", channel=CHANNEL))
        await daemon.gateway.wait_idle()
        assert await ran(daemon) == [("users_command", "allowed")]  # clock never ran
        assert len(model.prompts) == 1  # and the model was not asked again
        assert conn.texts(USER) == [] and await daemon.store.list_outbound() == []
        assert await outcome(daemon, "m-withdrawn") == (InboundStatus.FAILED, "user not allowed")
        assert f"access of {CHANNEL}:{USER} was withdrawn during its turn" in caplog.text
        assert "check the time" not in caplog.text  # the message's text is never logged
    finally:
        await daemon.stop()


@pytest.mark.parametrize("one_step", [True, False])
async def test_an_allowed_users_two_tool_turn_completes(tmp_path, one_step):
    model = ScriptedModel(two_tools("allow", one_step))  # same path, access kept
    daemon, conn = await started(tmp_path, model)
    try:
        await conn.handler(msg("check the time", user=USER, mid="m-allowed", channel=CHANNEL))
        await daemon.gateway.wait_idle()
        assert await ran(daemon) == [("users_command", "allowed"), ("clock", "allowed")]
        [reply] = answers(conn.texts(USER))
        assert reply.startswith("done: openclaw users allow: exit status 0 | ")
        assert await outcome(daemon, "m-allowed") == (InboundStatus.PROCESSED, None)
    finally:
        await daemon.stop()

