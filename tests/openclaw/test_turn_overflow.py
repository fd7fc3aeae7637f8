"""A turn whose own tool results outgrow the model's context (two long files read to compare
them) still ends with the model's answer: the older results of the turn are shortened in the
prompt (the store keeps them whole), the newest stays whole, and every call keeps its result.
Real daemon and SQLite; a scripted model whose 'tokens' are words."""

from __future__ import annotations

import json
from typing import Any

from skills.base import Skill, SkillContext
from tests.helpers.daemon import say, started
from tests.helpers.replies import answer
from tests.helpers.scripted_model import ScriptedModel

EXTRA = """
context_tokens = 900
reply_max_tokens = 100
[skills]
enabled = ["tests.openclaw.test_turn_overflow:LongRead"]
"""


class LongRead(Skill):
    """Test only: a long document, 400 words, each naming the document."""

    name = "long_read"
    description = "Test only: read a long document."
    parameters = {"type": "object", "properties": {"doc": {"type": "string"}}, "required": ["doc"]}
    side_effects = False  # it only reads

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        return " ".join([f"{args['doc']}-word"] * 400)


def call(doc: str) -> str:
    return "<tool_call>" + json.dumps({"name": "long_read", "arguments": {"doc": doc}}) + "</tool_call>"


def reader(messages: list[dict]) -> str:
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        return call("first")
    if len(results) == 1:
        return call("second")
    return "compared: " + " / ".join(f"{len(m['content'].split())} words" for m in results)


async def test_a_turn_whose_tool_results_outgrow_the_context_still_gets_an_answer(tmp_path):
    model = ScriptedModel(reader)
    daemon, conn = await started(tmp_path, model, EXTRA)
    try:
        reply = answer(await say(daemon, conn, "compare the two documents"))
        assert reply.startswith("compared: "), reply
        last = model.prompts[-1]
        assert len(model.encode_chat(last)) <= 800  # the prompt budget: 900 - 100
        first, second = [m["content"] for m in last if m["role"] == "tool"]
        assert "first-word" in first and len(first.split()) < 400  # shortened, and says so
        assert "left out" in first
        assert second.split() == ["second-word"] * 400  # the newest result stays whole
        conversation = await daemon.store.active_conversation("terminal:local", "local")
        stored = [m.content for m in await daemon.store.list_messages(conversation.id)
                  if m.role == "tool"]
        assert [len(c.split()) for c in stored] == [400, 400]  # the store keeps every word
    finally:
        await daemon.stop()
