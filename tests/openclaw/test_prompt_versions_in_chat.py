"""The agent answers with the user's version of the system prompt (openclaw/prompts), and every
assistant message it stores keeps the label of the versions it was answered with: a changed active
version changes the next turn, never the stored history. Real daemon and SQLite; a scripted model
that says which system prompt it was shown."""

from __future__ import annotations

import asyncio

from openclaw.agent.loop import Caller
from openclaw.cli import main
from openclaw.scheduler.agent_job import QuietSink
from openclaw.store import Store
from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel

OWNER = "terminal:local"


def shown_system(messages: list[dict]) -> str:
    return f"answered under: {messages[0]['content']}"


async def assistant_messages(store: Store) -> list[tuple[str, str | None]]:
    conv = await store.active_conversation(OWNER, "local")
    return [(m.content, m.prompt_version) for m in await store.list_messages(conv.id)
            if m.role == "assistant"]


async def test_a_new_active_version_answers_the_next_turn_and_leaves_history_as_it_was(tmp_path):
    model = ScriptedModel(shown_system)
    daemon, conn = await started(tmp_path, model)
    try:
        await daemon.store.add_prompt_versions(
            [("system", "v1", "You are terse."), ("system", "v2", "You are chatty.")], "ada")
        await daemon.store.activate_prompt("system", "v1")
        assert await say(daemon, conn, "hello") == "answered under: You are terse."

        # The admin activates v2 from the command line (another process's store), and the
        # daemon's reload makes it re-read the library at once (else within a few seconds).
        config = tmp_path / "openclaw.toml"
        assert await asyncio.to_thread(
            main, ["--config", str(config), "prompts", "activate", "system", "v2"]) == 0
        assert (await daemon.reload(notify=False)).ok
        assert await say(daemon, conn, "hello again") == "answered under: You are chatty."

        assert await assistant_messages(daemon.store) == [
            ("answered under: You are terse.", "system=v1;tools=builtin"),
            ("answered under: You are chatty.", "system=v2;tools=builtin")]
    finally:
        await daemon.stop()


async def test_without_a_library_the_configs_prompt_answers_and_the_label_says_so(tmp_path):
    model = ScriptedModel(shown_system)
    daemon, conn = await started(tmp_path, model, 'system_prompt = "From the config."')
    try:
        assert await say(daemon, conn, "hello") == "answered under: From the config."
        conv = await daemon.store.active_conversation(OWNER, "local")
        caller = Caller(daemon.gateway.access.principal(OWNER), "local")
        result = await daemon.gateway.agent.run_turn(conv.id, caller, "and now?", QuietSink(), "r1")
        assert result.prompt_version == "system=config;tools=builtin"
        assert await assistant_messages(daemon.store) == [
            ("answered under: From the config.", "system=config;tools=builtin")] * 2
    finally:
        await daemon.stop()


async def test_a_pinned_user_gets_their_version_in_every_model_call_of_the_turn(tmp_path):
    calls = []

    def reply(messages: list[dict]) -> str:  # a tool call first, then the answer
        calls.append(messages[0]["content"])
        if messages[-1]["role"] == "user":
            return '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        return "done"

    daemon, conn = await started(tmp_path, ScriptedModel(reply))
    try:
        await daemon.store.add_prompt_versions(
            [("system", "v1", "Active."), ("system", "v2", "Pinned.")], "ada")
        await daemon.store.activate_prompt("system", "v1")
        await daemon.store.pin_prompt(OWNER, "system", "v2")
        assert (await say(daemon, conn, "hello")).endswith("done")
        assert calls == ["Pinned.", "Pinned."]
        assert [label for _, label in await assistant_messages(daemon.store)] == \
            ["system=v2;tools=builtin"] * 2
    finally:
        await daemon.stop()


class CountingModel(ScriptedModel):
    """A scripted model that also keeps the template each prompt count was asked under."""

    def __init__(self, reply) -> None:
        super().__init__(reply)
        self.counted_under: list[str | None] = []

    async def count_chat(self, messages, tools=None, tool_instructions=None) -> int:
        self.counted_under.append(tool_instructions)
        return await super().count_chat(messages, tools, tool_instructions)


async def test_a_users_tools_version_is_the_template_of_every_model_call_and_count(tmp_path):
    def reply(messages: list[dict]) -> str:  # a tool call first, then the answer
        if messages[-1]["role"] == "user":
            return '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
        return "done"

    model = CountingModel(reply)
    daemon, conn = await started(tmp_path, model)
    try:
        template = "Call one of these:\n{tools}\nThat is all."
        await daemon.store.add_prompt_versions([("tools", "v1", template)], "ada")
        await daemon.store.pin_prompt(OWNER, "tools", "v1")
        assert (await say(daemon, conn, "what time is it?")).endswith("done")
        assert model.tool_instructions == [template, template]
        # The prompt budget is counted under the same template (a sum of cached counts may
        # skip some counts, never take one under another template).
        assert model.counted_under and all(
            t == template for t in model.counted_under if t is not None)
        assert template in model.counted_under
        assert [label for _, label in await assistant_messages(daemon.store)] == \
            ["system=config;tools=v1"] * 2

        await daemon.store.unpin_prompt(OWNER, "tools")
        daemon.store.forget_prompt_snapshot()
        await say(daemon, conn, "and now?")
        assert model.tool_instructions[2:] == [None, None]  # the built-in one: no keyword sent
    finally:
        await daemon.stop()
