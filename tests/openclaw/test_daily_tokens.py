"""A role's `daily_tokens`: once a user's tokens today (prompt + answer, as /status counts them)
reach it, their messages get a reply that says so and the model is not asked; other users, other
roles and commands go on; a reload that raises the cap lets them in again. Real daemon and
SQLite; a scripted model."""

from __future__ import annotations

import asyncio
import re

from openclaw.agent.loop import TOKENS_SPENT
from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.replies import answers
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

CONFIG = """
data_dir = "{data}"
[admin]
enabled = false
[access]
admins = ["telegram:9"]
allow = ["telegram:1", "telegram:2"]
roles = {{ "telegram:1" = "kid" }}
[roles.kid]
skills = ["clock"]
daily_tokens = {cap}
[skills]
enabled = ["clock"]
[agent]
reply_max_tokens = 40
compaction_keep_messages = 2
"""

CLOCK = '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'


class HeldAfterTools(ScriptedModel):
    """Calls the clock until told otherwise; a call that reads a tool's result first waits for
    `hold` (None: it does not wait)."""

    def __init__(self, reply) -> None:
        super().__init__(reply, chunk=1000)
        self.hold: asyncio.Event | None = None
        self.held = 0

    async def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                       cache_salt=None):
        if prompt[-1]["role"] == "tool" and self.hold is not None:
            self.held += 1
            await self.hold.wait()
        async for out in super().generate(prompt, params, request_id, tools=tools,
                                          priority=priority, cache_salt=cache_salt):
            yield out


async def started(tmp_path, model, cap: int) -> tuple[Daemon, RecordingConnector]:
    """The daemon with a Telegram-named connector, `telegram:1` on a role of `cap` tokens a day."""
    path = tmp_path / "openclaw.toml"
    path.write_text(CONFIG.format(data=tmp_path / "data", cap=cap))
    conn = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=model, connectors=[conn])
    await daemon.start()
    return daemon, conn


async def test_a_user_past_their_roles_daily_tokens_is_told_and_the_model_not_asked(tmp_path):
    model = ScriptedModel(lambda messages: "an answer of six words here")
    daemon, conn = await started(tmp_path, model, 40)
    path = tmp_path / "openclaw.toml"

    async def say(text: str, user: str) -> str:
        await conn.handler(msg(text, user=user, channel="telegram"))
        await daemon.gateway.wait_idle()
        return conn.texts(user)[-1]

    try:
        assert await say("first question", "1") == "an answer of six words here"
        used = await daemon.store.tokens_today("telegram:1")
        assert used >= 40  # the first turn crossed the cap, and still finished
        asked = len(model.prompts)
        reply = await say("second question", "1")
        assert reply.startswith("You have used today's 40 tokens")
        assert len(model.prompts) == asked  # the model was not asked
        assert await daemon.store.tokens_today("telegram:1") == used  # and nothing was counted
        assert f"you {used} of 40 a day" in await say("/status", "1")  # commands still answer
        # Another user, of a role without a cap, is not affected.
        assert await say("my question", "2") == "an answer of six words here"
        assert "of 40 a day" not in await say("/status", "2")
        path.write_text(CONFIG.format(data=tmp_path / "data", cap=10_000))
        assert (await daemon.reload()).applied == ["roles"]
        assert await say("third question", "1") == "an answer of six words here"
    finally:
        await daemon.stop()


async def test_a_turn_that_reaches_the_cap_between_its_steps_stops_there(tmp_path):
    model = HeldAfterTools(lambda messages: CLOCK)  # would call the clock for all 8 steps
    daemon, conn = await started(tmp_path, model, 60)  # one step's prompt alone passes 60
    try:
        await conn.handler(msg("what time is it", user="1", channel="telegram"))
        await daemon.gateway.wait_idle()
        assert answers(conn.texts("1")) == [TOKENS_SPENT]
        assert len(model.prompts) == 1  # the clock ran once, and the model was not asked again
        conv = await daemon.store.active_conversation("telegram:1", "1", "telegram")
        roles = [m.role for m in await daemon.store.list_messages(conv.id)]
        assert roles == ["user", "assistant", "tool"]
        assert await daemon.store.tokens_today("telegram:1") > 60  # that step was counted
    finally:
        await daemon.stop()


async def test_turns_running_in_a_users_other_chats_count_against_the_cap(tmp_path):
    def reply(messages):  # the clock once, then an answer
        return "done" if messages[-1]["role"] == "tool" else CLOCK

    model = HeldAfterTools(reply)
    model.hold = asyncio.Event()
    daemon, conn = await started(tmp_path, model, 100_000)
    try:
        # Chat A: one step done, its next waits. What it spent is not in the store yet.
        await conn.handler(msg("time please", user="1", chat="A", channel="telegram"))
        await until(lambda: model.held == 1)
        await conn.handler(msg("/status", user="1", chat="A", channel="telegram"))
        await until(lambda: conn.texts("A"))
        running = int(re.search(r"you (\d+) of", conn.texts("A")[-1])[1])
        assert running > 0 and await daemon.store.tokens_today("telegram:1") == 0
        # A cap that chat A's running turn and one more step pass together.
        (tmp_path / "openclaw.toml").write_text(CONFIG.format(data=tmp_path / "data",
                                                              cap=running + 1))
        assert (await daemon.reload()).applied == ["roles"]
        await conn.handler(msg("time please", user="1", chat="B", channel="telegram"))
        await until(lambda: conn.texts("B") or model.held == 2)
        model.hold.set()
        await daemon.gateway.wait_idle()
        assert answers(conn.texts("B")) == [TOKENS_SPENT]  # its own step plus chat A's passed the cap
        assert answers(conn.texts("A"))[-1] == "done"  # the turn that began within it ends normally
        # And with both in the store, a new message is told at once.
        await conn.handler(msg("again", user="1", chat="C", channel="telegram"))
        await daemon.gateway.wait_idle()
        assert conn.texts("C")[0].startswith(f"You have used today's {running + 1} tokens")
    finally:
        await daemon.stop()


async def test_a_turn_ending_is_never_counted_twice_while_its_usage_is_written(tmp_path):
    """The turn's tokens leave the running count as they enter the store, under one lock: a
    look taken while its usage row is written (/status, the cap) counts them once, never twice."""
    model = ScriptedModel(lambda messages: "an answer of a few words", chunk=1000)
    daemon, conn = await started(tmp_path, model, cap=10**9)
    gw, seen, stop = daemon.gateway, [], asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            seen.append(await gw.spending.today("telegram:1"))

    try:
        for i in range(8):
            stop.clear()
            poller = asyncio.create_task(poll())
            await conn.handler(msg(f"question {i}", user="1", channel="telegram"))
            await gw.wait_idle()
            stop.set()
            await poller
            spent = await daemon.store.tokens_today("telegram:1")
            assert max(seen) <= spent, f"looked {max(seen)} while only {spent} were ever spent"
    finally:
        await daemon.stop()


async def test_status_everyone_counts_the_running_turns_as_you_does(tmp_path):
    """/status for the owner: 'everyone' counts the running turns as 'you' does, so it is never
    below it."""
    def reply(messages):
        return "done" if messages[-1]["role"] == "tool" else CLOCK

    model = HeldAfterTools(reply)
    model.hold = asyncio.Event()
    daemon, conn = await started(tmp_path, model, cap=10**9)
    try:
        await conn.handler(msg("time please", user="9", chat="A", channel="telegram"))
        await until(lambda: model.held == 1)
        await conn.handler(msg("/status", user="9", chat="9", channel="telegram"))
        await until(lambda: conn.texts("9"))
        status = conn.texts("9")[-1]
        you = int(re.search(r"you (\d+)", status)[1])
        everyone = int(re.search(r"everyone (\d+)", status)[1])
        model.hold.set()
        await daemon.gateway.wait_idle()
        assert everyone >= you, status
    finally:
        await daemon.stop()


async def test_summaries_a_turn_needs_are_model_calls_the_cap_stops_too(tmp_path):
    """The summarising calls a turn's history needs are model calls like its steps: a turn admitted
    just under the cap makes one call (whichever comes first), and no call starts past the cap."""
    def reply(messages):
        if "You write the memory" in messages[0]["content"]:
            return "SUMMARY: many words were said " * 3
        return "an answer"

    model = ScriptedModel(reply, max_model_len=200, chunk=1000)
    daemon, conn = await started(tmp_path, model, cap=1)  # 0 used < 1: the turn is admitted
    try:
        store = daemon.store
        await store.ensure_user("telegram", "1", None)
        conv = await store.active_conversation("telegram:1", "1", "telegram")
        for i in range(20):  # a history well past the 160-token prompt budget
            await store.add_message(conv.id, "user" if i % 2 == 0 else "assistant",
                                    f"message {i} " + "word " * 9, token_count=14)
        await conn.handler(msg("and now?", user="1", channel="telegram"))
        await daemon.gateway.wait_idle()
        used, calls_past_cap = 0, 0
        for prompt_tokens, output_tokens in model.spent:  # in the order the calls were made
            if used >= 1:
                calls_past_cap += 1  # a call started with the cap already reached
            used += prompt_tokens + output_tokens
        assert calls_past_cap == 0, (f"{len(model.spent)} model calls, {calls_past_cap} of them "
                                     "started with the day's tokens already spent")
        assert len(model.spent) == 1 and conn.texts("1") == [TOKENS_SPENT]
    finally:
        await daemon.stop()
