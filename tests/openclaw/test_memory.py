"""Long-term memory in the running daemon (real gateway, agent, skill and SQLite; scripted model):
kept across /new and a restart, read into the prompt within its budget, each user's and each
group's apart (skill, command, prompt), off when the user says so, and compaction's summaries
kept in it."""

from __future__ import annotations

import json

from openclaw.agent.memory import MEMORY_HEADER
from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.store.memory_records import MemoryKind
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.replies import answer
from tests.helpers.scripted_model import ScriptedModel

ADA, BOB, GROUP = "1", "2", "-77"


def memory_in(prompt: list[dict]) -> str:
    """The memory message of a prompt, "" when it has none."""
    found = [m["content"] for m in prompt if m["content"].startswith(MEMORY_HEADER)]
    assert len(found) <= 1
    return found[0] if found else ""


def reply(prompt: list[dict]) -> str:
    """'mem ACTION {json}' makes one memory call; a tool result is said back; a summary request is
    answered with the transcript's first words; anything else with the prompt's memory."""
    if "Summarise the conversation" in prompt[0]["content"]:
        return "SUMMARY " + " ".join(prompt[-1]["content"].splitlines()[0].split()[:6])
    last_user = max(i for i, m in enumerate(prompt) if m["role"] == "user")
    tools = [m["content"] for m in prompt[last_user:] if m["role"] == "tool"]
    if tools:
        return "OK: " + tools[-1]
    text = prompt[last_user]["content"]
    if text.startswith("mem "):
        action, _, rest = text[4:].partition(" ")
        call = {"name": "memory", "arguments": {"action": action, **(json.loads(rest) if rest else {})}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    return "MEMORY: " + (memory_in(prompt) or "none")


def write_config(tmp_path, extra: str = "") -> object:
    path = tmp_path / "openclaw.toml"
    path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
allow = ["telegram:{ADA}", "telegram:{BOB}"]
[admin]
enabled = false
[skills]
enabled = ["memory"]
[roles.user]
skills = ["memory"]
{extra}
""")
    return load_config(path)


class Chat:
    def __init__(self, daemon: Daemon, conn: RecordingConnector) -> None:
        self.daemon, self.conn = daemon, conn

    async def say(self, text: str, user: str = ADA, chat: str | None = None) -> str:
        before = len(self.conn.sent)
        in_group = chat == GROUP
        await self.conn.handler(msg(text, user=user, chat=chat or user, channel="telegram",
                                    is_group=in_group))
        await self.daemon.gateway.wait_idle()
        assert len(self.conn.sent) > before, f"no reply to {text!r}"
        return answer(self.conn.sent[-1][1])


async def start(tmp_path, model: ScriptedModel, extra: str = "") -> Chat:
    conn = RecordingConnector("telegram")
    daemon = Daemon(write_config(tmp_path, extra), model=model, connectors=[conn])
    await daemon.start()
    return Chat(daemon, conn)


async def test_memory_survives_new_and_a_restart(tmp_path):
    chat = await start(tmp_path, ScriptedModel(reply))
    try:
        assert (await chat.say("/remember My name is Ada")).startswith(
            "Remembered in your private chats as #1")
        assert "Remembered" in await chat.say('mem remember {"text": "Ada likes kiwis"}')
        await chat.say("/new")
        seen = await chat.say("what fruit do I like? kiwis?")
        assert "- (fact) My name is Ada" in seen and "- (fact) Ada likes kiwis" in seen
        assert "My name is Ada" in await chat.say("hello")  # pinned: read whatever is asked
        assert "kiwis" not in await chat.say("hello")  # not pinned: only when it is relevant
    finally:
        await chat.daemon.stop()
    chat = await start(tmp_path, ScriptedModel(reply))
    try:
        assert "Ada likes kiwis" in await chat.say("kiwis again")
        assert "#1 📌 (fact) My name is Ada" in await chat.say("/memory")
    finally:
        await chat.daemon.stop()


async def test_a_user_never_sees_another_users_memory(tmp_path):
    chat = await start(tmp_path, ScriptedModel(reply))
    try:
        await chat.say("/remember my zebra password hint", user=ADA)
        await chat.say('mem remember {"text": "zebra diagnosis"}', user=ADA)
        assert "zebra" in await chat.say("zebra?", user=ADA)
        # Bob, in his own chat: not in his prompt, his /memory, his search, his forget.
        assert await chat.say("zebra?", user=BOB) == "MEMORY: none"
        assert "Nothing is kept" in await chat.say("/memory", user=BOB)
        assert "Nothing in memory" in await chat.say('mem recall {"text": "zebra"}', user=BOB)
        assert "no entry #1" in await chat.say("/memory forget 1", user=BOB)
        assert "no entry #2" in await chat.say('mem forget {"number": 2}', user=BOB)
        # Nor in a group they share.
        assert "zebra" not in await chat.say("zebra?", user=BOB, chat=GROUP)
        assert len(await chat.daemon.store.list_memories("telegram:" + ADA)) == 2
    finally:
        await chat.daemon.stop()


async def test_group_memory_stays_in_the_group_unless_kept_everywhere(tmp_path):
    chat = await start(tmp_path, ScriptedModel(reply))
    try:
        assert "in this group" in await chat.say("/remember walrus plan for the team", chat=GROUP)
        await chat.say("/remember walrus private note")
        assert "walrus private note" not in await chat.say("walrus?", chat=GROUP)
        assert "walrus plan" in await chat.say("walrus?", chat=GROUP)
        assert "walrus plan" not in await chat.say("walrus?")
        assert "walrus plan" not in await chat.say("/memory")
        assert "no entry #1" in await chat.say("/memory forget 1")  # the group's, not here
        assert "in all your chats" in await chat.say("/remember --everywhere call me Ada")
        assert "call me Ada" in await chat.say("hi", chat=GROUP)
        assert "call me Ada" in await chat.say("/memory", chat=GROUP)
    finally:
        await chat.daemon.stop()


async def test_memory_off_keeps_and_reads_nothing_and_forget_deletes(tmp_path):
    chat = await start(tmp_path, ScriptedModel(reply))
    try:
        await chat.say("/remember the heron is grey")
        assert "Memory is off" in await chat.say("/memory off")
        assert await chat.say("heron?") == "MEMORY: none"
        assert "memory is off" in await chat.say("/remember the heron flies")
        assert "turned their memory off" in await chat.say('mem remember {"text": "heron"}')
        assert "Your memory is off" in await chat.say("/memory")
        assert "Memory is on" in await chat.say("/memory on")
        assert "heron is grey" in await chat.say("heron?")
        assert "Forgot #1: the heron is grey" in await chat.say("/memory forget 1")
        assert await chat.say("heron?") == "MEMORY: none"
        assert await chat.daemon.store.search_memories("telegram:1", ["private"], "heron") == []
    finally:
        await chat.daemon.stop()


async def test_the_prompt_holds_memory_within_its_budget_exactly(tmp_path):
    model = ScriptedModel(reply)
    chat = await start(tmp_path, model, "[agent]\nmemory_tokens = 40")
    try:
        for n in range(12):
            await chat.say(f"/remember rule number {n} holds")
        await chat.say("go")
        message = next(m for m in model.prompts[-1] if m["content"].startswith(MEMORY_HEADER))
        lines = message["content"].splitlines()[1:]
        assert await model.count_chat([message]) <= 40
        one_more = {"role": "system", "content": message["content"] + f"\n- (fact) rule number "
                                                                      f"{len(lines)} holds"}
        assert await model.count_chat([one_more]) > 40
        assert lines[0] == "- (fact) rule number 0 holds"  # the oldest pinned first
        # After the system prompt, whose prefix the cache keeps; just before the new message.
        assert model.prompts[-1][0]["content"] == chat.daemon.config.agent.system_prompt
        assert model.prompts[-1][-1] == {"role": "user", "content": "go"}
        assert model.prompts[-1][-2] is message
    finally:
        await chat.daemon.stop()


async def test_compaction_keeps_its_summary_in_memory_so_new_does_not_forget_it(tmp_path):
    model = ScriptedModel(reply)
    chat = await start(tmp_path, model, "[agent]\ncontext_tokens = 260\nreply_max_tokens = 40\n"
                                        "compaction_keep_messages = 2\nmemory_tokens = 80")
    try:
        await chat.say("pelicans nest near the old lighthouse every spring")
        for n in range(12):
            await chat.say(f"filler message number {n} with a good few more words in it, to fill "
                           "the context up sooner than later")
        kept = await chat.daemon.store.list_memories("telegram:1")
        summaries = [e for e in kept if e.kind is MemoryKind.SUMMARY]
        assert summaries and summaries[0].source.startswith("summary:")
        assert "pelicans" in summaries[0].text
        await chat.say("/new")
        assert "pelicans" in await chat.say("where do pelicans nest?")
    finally:
        await chat.daemon.stop()


async def test_a_message_that_fits_only_without_memory_is_answered_without_it(tmp_path):
    model = ScriptedModel(reply)
    chat = await start(tmp_path, model, "[agent]\ncontext_tokens = 200\nreply_max_tokens = 40\n"
                                        "memory_tokens = 100")
    try:
        for n in range(4):
            await chat.say(f"/remember standing rule {n}: " + "words " * 12)
        long_message = "please read " + "this " * 100
        assert await chat.say(long_message) == "MEMORY: none"
        assert "standing rule 0" in await chat.say("short one")
    finally:
        await chat.daemon.stop()
