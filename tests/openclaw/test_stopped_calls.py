"""A turn stopped while a tool runs stores a result for the call that says so: it may have done
part of its work. Without one the prompt said "not run" (a model shown a bare call may take it as
done, or make a result up), false for a command cut short. Real daemon and SQLite; a scripted
model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from skills.base import Skill, SkillContext
from tests.openclaw.scripted_model import ScriptedModel
from tests.openclaw.test_daemon import msg, say, started, until

EXTRA = """
[skills]
enabled = ["tests.openclaw.test_stopped_calls:Slow"]
"""


class Slow(Skill):
    """Test only: never finishes; the test stops the turn while it runs."""

    name = "slow"
    description = "Test only: a tool that takes forever."
    parameters = {"type": "object", "properties": {}}
    running = asyncio.Event()

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        Slow.running.set()
        await asyncio.Event().wait()
        return "never"


def script(messages: list[dict]) -> str:
    if messages[-1]["role"] == "user" and messages[-1]["content"] == "start":
        return "<tool_call>" + json.dumps({"name": "slow", "arguments": {}}) + "</tool_call>"
    return "ok"


async def test_a_call_stopped_while_it_ran_shows_as_stopped_in_the_next_prompt(tmp_path):
    Slow.running = asyncio.Event()
    model = ScriptedModel(script)
    daemon, conn = await started(tmp_path, model, EXTRA)
    try:
        await conn.handler(msg("start"))
        await until(Slow.running.is_set)
        await conn.handler(msg("/stop"))
        await daemon.gateway.wait_idle()
        assert await say(daemon, conn, "and now?") == "ok"
        prompt = model.prompts[-1]
        called = next(m for m in prompt if m.get("tool_calls"))
        call_id = called["tool_calls"][0]["id"]
        after = prompt[prompt.index(called) + 1]
        assert after["role"] == "tool" and after["tool_call_id"] == call_id
        assert after["content"].startswith("error: stopped:") and "may have done" in after["content"]
        assert "not run" not in after["content"]
        assert prompt[-1] == {"role": "user", "content": "and now?"}
    finally:
        await daemon.stop()
