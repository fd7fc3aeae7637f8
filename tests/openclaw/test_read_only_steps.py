"""A model step whose calls only read is stored with its first call's result, one commit for
both (openclaw/agent/loop.py); a step calling a skill that may act is stored before the skill runs,
as ever. The stored messages are the same either way, and /stop while a reading call runs stores
the step and its stopped result. Real daemon and SQLite (the loop's writer); a scripted model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from openclaw.agent.loop import STOPPED_CALL
from skills.base import Skill, SkillContext
from tests.helpers.daemon import msg, say, started
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

HERE = "tests.openclaw.test_read_only_steps"
EXTRA = f"""
[skills]
enabled = ["clock", "{HERE}:Look", "{HERE}:Poke", "{HERE}:Stare"]
"""
COMMITS: dict[str, int] = {}  # the loop writer's commits when each point was reached
WRITER: list[Any] = []  # the daemon's loop writer, for the skills to read


class Look(Skill):
    """Test only: reads, changes nothing."""

    name = "look"
    description = "Test only: looks."
    parameters = {"type": "object", "properties": {}}
    side_effects = False
    untrusted_output = False

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        COMMITS["ran"] = WRITER[0].commits
        return f"{self.name} done"


class Poke(Look):
    """Test only: may change something."""

    name = "poke"
    description = "Test only: pokes."
    side_effects = True


class Stare(Look):
    """Test only: reads, and never finishes; the test stops the turn while it runs."""

    name = "stare"
    description = "Test only: stares forever."
    running = asyncio.Event()

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        Stare.running.set()
        await asyncio.Event().wait()
        return "never"


def _script(messages: list[dict]) -> str:
    last = messages[-1]
    if last["role"] == "user" and last["content"].startswith("call "):
        COMMITS["step"] = WRITER[0].commits
        name = last["content"].removeprefix("call ")
        return "<tool_call>" + json.dumps({"name": name, "arguments": {}}) + "</tool_call>"
    if last["role"] == "tool":
        COMMITS["result"] = WRITER[0].commits
    return "done"


async def _stored(daemon) -> list:
    """The console owner's conversation, as stored."""
    conversation = await daemon.store.active_conversation("terminal:local", "local")
    return await daemon.store.list_messages(conversation.id)


async def _turn(tmp_path, skill: str) -> tuple[dict[str, int], list[tuple]]:
    """One turn calling `skill`: the commits seen, and the conversation's stored messages."""
    COMMITS.clear()
    tmp_path.mkdir(exist_ok=True)
    daemon, conn = await started(tmp_path, ScriptedModel(_script), EXTRA)
    try:
        WRITER[:] = [daemon.store.loop_writer]
        assert (await say(daemon, conn, f"call {skill}")).endswith("done")
        stored = await _stored(daemon)
    finally:
        await daemon.stop()
    return dict(COMMITS), stored


@pytest.mark.parametrize("skill, acts", [("clock", False), ("look", False), ("poke", True)])
async def test_a_step_that_only_reads_is_stored_with_its_result_in_one_commit(tmp_path, skill,
                                                                              acts):
    commits, stored = await _turn(tmp_path, skill)
    # The step and its result: one commit where the call only reads, two where it may act.
    assert commits["result"] - commits["step"] == (2 if acts else 1)
    if "ran" in commits:  # the step is stored before a skill that may act runs, not before one
        assert commits["ran"] - commits["step"] == (1 if acts else 0)  # that only reads
    user, step, result, answer = stored
    assert (user.role, user.content) == ("user", f"call {skill}")
    assert step.role == "assistant" and [c["function"]["name"] for c in step.tool_calls] == [skill]
    assert result.role == "tool" and result.tool_call_id == step.tool_calls[0]["id"]
    assert (answer.role, answer.content) == ("assistant", "done")
    assert [m.id for m in stored] == list(range(user.id, user.id + 4))


async def test_the_stored_messages_are_the_same_whether_the_call_reads_or_acts(tmp_path):
    def shape(stored: list) -> list[tuple]:
        return [(m.role, m.content.replace("poke", "look"),
                 m.tool_call_id is not None, bool(m.tool_calls), m.token_count, m.prompt_version)
                for m in stored]

    _, reads = await _turn(tmp_path / "reads", "look")
    _, acts = await _turn(tmp_path / "acts", "poke")
    assert shape(reads) == shape(acts)
    assert [m.id for m in reads] == [m.id for m in acts]


async def test_stop_while_a_reading_call_runs_stores_the_step_and_its_stopped_result(tmp_path):
    Stare.running = asyncio.Event()
    daemon, conn = await started(tmp_path, ScriptedModel(_script), EXTRA)
    try:
        WRITER[:] = [daemon.store.loop_writer]
        await conn.handler(msg("call stare"))
        await until(Stare.running.is_set)
        # Nothing yet: the user's message is held for the step, which waits for its result.
        assert await _stored(daemon) == []
        await conn.handler(msg("/stop"))
        await daemon.gateway.wait_idle()
        user, step, result = await _stored(daemon)
        assert step.role == "assistant" and step.tool_calls[0]["function"]["name"] == "stare"
        assert (result.role, result.content) == ("tool", STOPPED_CALL)
        assert result.tool_call_id == step.tool_calls[0]["id"]
        assert (step.id, result.id) == (user.id + 1, user.id + 2)
    finally:
        await daemon.stop(drain_timeout=0.1)


async def test_a_reading_call_that_needs_approval_has_its_step_stored_before_it_asks(tmp_path):
    approval = EXTRA + '[roles.admin]\napproval = ["look"]\n'
    daemon, conn = await started(tmp_path, ScriptedModel(_script), approval)
    try:
        WRITER[:] = [daemon.store.loop_writer]
        await conn.handler(msg("call look"))
        await until(lambda: any("Approval needed" in text for text in conn.texts()))
        user, step = await _stored(daemon)
        assert step.role == "assistant" and step.tool_calls[0]["function"]["name"] == "look"
        await conn.handler(msg("/stop"))
        await daemon.gateway.wait_idle()
    finally:
        await daemon.stop(drain_timeout=0.1)


RELOADING: list[Any] = []  # the daemon whose config the script changes mid-step


def _reloading_script(messages: list[dict]) -> str:
    last = messages[-1]
    if last["role"] == "user" and last["content"] == "call look":
        daemon = RELOADING[0]
        path = daemon.config.source
        path.write_text(path.read_text() + '[roles.admin]\napproval = ["look"]\n')
        assert daemon._reload().ok  # the admin's SIGHUP, while the model writes the step
        return "<tool_call>" + json.dumps({"name": "look", "arguments": {}}) + "</tool_call>"
    return "done"


async def test_a_reload_that_asks_approval_mid_step_still_has_the_step_stored_first(tmp_path):
    # The step was judged one that only reads, with the role as it was; the call runs with the
    # role as it is now, which asks for approval: the step is stored before the question.
    daemon, conn = await started(tmp_path, ScriptedModel(_reloading_script), EXTRA)
    RELOADING[:] = [daemon]
    try:
        await conn.handler(msg("call look"))
        await until(lambda: any("Approval needed" in text for text in conn.texts()))
        conversation = await daemon.store.active_conversation("terminal:local", "local")
        stored = await daemon.store.list_messages(conversation.id)
        assert [m.role for m in stored] == ["user", "assistant"]
        await conn.handler(msg("/stop"))
        await daemon.gateway.wait_idle()
    finally:
        await daemon.stop(drain_timeout=0.1)
