"""The user's message is stored without its token count, which is stored once the reply is out
(Agent.count_later): far from the budget the prompt takes the message at its bound, so the reply
waits for no encoding of it (openclaw/agent/loop.py, agent/context.py fits_alone)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from openclaw.agent.model import ModelUnavailable
from openclaw.store import Store
from tests.helpers.daemon import msg, say, started
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until


class Counted(ScriptedModel):
    """Counts a message by words, as its encode_chat does, with a bound (its characters) like the
    engine's, and records when each message alone is counted."""

    fixed_counts = True

    def __init__(self) -> None:
        super().__init__(lambda messages: "the answer", max_model_len=100_000)
        self.counted: list[str] = []

    def count_message(self, message: dict, after: dict) -> int:
        self.counted.append(str(message.get("content")))
        return len(str(message.get("content", "")).split()) + 4

    def bound_message(self, message: dict, after: dict) -> int:
        return len(str(message.get("content", ""))) + 4


async def test_the_users_message_is_counted_after_its_reply_and_its_count_stored(tmp_path):
    model = Counted()
    daemon, conn = await started(tmp_path, model)
    seen_at_send: list[Any] = []
    send = conn.send_text

    async def sending(chat_id: str, text: str) -> str:
        conversation = await daemon.store.active_conversation("terminal:local", "local")
        user = (await daemon.store.list_messages(conversation.id))[-2]
        seen_at_send.append((user.content, user.token_count, list(model.counted)))
        return await send(chat_id, text)

    conn.send_text = sending
    try:
        for text in ("a first message", "a second one", "and a third one with more words"):
            assert await say(daemon, conn, text) == "the answer"
        conversation = await daemon.store.active_conversation("terminal:local", "local")
        users = [m for m in await daemon.store.list_messages(conversation.id) if m.role == "user"]
    finally:
        await daemon.stop()
    # At the third reply's send (the first two checked the sums against whole counts) its message
    # was stored, not counted, and had no count yet; the one before was counted after its reply.
    content, tokens, counted = seen_at_send[2]
    assert content == "and a third one with more words" and tokens is None
    assert content not in counted and "a second one" in counted
    assert [m.token_count for m in users] == [3 + 4, 3 + 4, 7 + 4]


@pytest.mark.parametrize("loop_writes", [True, False])
async def test_a_token_count_is_stored_on_both_paths_and_refused_for_no_message(tmp_path,
                                                                                loop_writes):
    async with await Store.open(f"sqlite:///{tmp_path / 's.db'}",
                                loop_writes=loop_writes) as store:
        user = await store.ensure_user("telegram", 1)
        conversation = await store.active_conversation(user.key, "1")
        message = await store.add_message(conversation.id, "user", "hello")
        await store.set_token_count(message.id, 12)
        assert (await store.list_messages(conversation.id))[0].token_count == 12
        with pytest.raises(LookupError, match="message 999"):
            await store.set_token_count(999, 3)


async def test_a_stopped_turns_message_still_gets_its_count(tmp_path):
    # /stop cancels the turn before its reply: the count is stored all the same, as the turn
    # ends (only a daemon stopping leaves it to the start that takes the message up).
    model = Counted()
    daemon, conn = await started(tmp_path, model)
    try:
        for text in ("one", "two"):  # the sums checked: the third is stored uncounted
            await say(daemon, conn, text)
        model.reply = lambda messages: "a long answer " * 20
        model.gate = asyncio.Event()  # the stream stalls after its first chunk
        await conn.handler(msg("tell me everything now"))
        await until(lambda: len(model.prompts) == 3)
        await conn.handler(msg("/stop"))
        await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
        conversation = await daemon.store.active_conversation("terminal:local", "local")
        stored = await daemon.store.list_messages(conversation.id)
        assert [(m.content, m.token_count) for m in stored if m.role == "user"][-1] == (
            "tell me everything now", 4 + 4)
    finally:
        model.gate = None
        await daemon.stop()


class Away(Counted):
    """The model, gone while `away`: every call fails as a server that went away does."""

    away = False

    async def generate(self, *args: Any, **kwargs: Any):
        if self.away:
            raise ModelUnavailable("the model's server went away")
        async for out in super().generate(*args, **kwargs):
            yield out


async def test_a_message_left_for_the_next_start_is_counted_as_its_turn_ends(tmp_path):
    # The daemon stops while the message waits for the model: the turn ends there, its message
    # stored for the next start, and counted as it ends.
    model = Away()
    daemon, conn = await started(tmp_path, model)
    try:
        for text in ("one", "two"):  # answered: the sums checked
            await say(daemon, conn, text)
        model.away = True
        await conn.handler(msg("wait for me please"))
        await until(lambda: len(conn.texts()) == 3)  # told that it waits for the model
    finally:
        await daemon.stop(drain_timeout=0.1)
    store = await Store.open(f"sqlite:///{tmp_path / 'data' / 'openclaw.db'}")
    try:
        conversation = await store.active_conversation("terminal:local", "local")
        stored = await store.list_messages(conversation.id)
        assert (stored[-1].content, stored[-1].token_count) == ("wait for me please", 4 + 4)
    finally:
        await store.close()


async def test_a_message_a_crash_left_uncounted_is_counted_when_taken_up(tmp_path):
    # Killed between storing the message and its reply, a run leaves it without its count: the
    # next start's turn takes it up (agent.resume) and counts it once its reply is out.
    daemon, conn = await started(tmp_path, Counted())
    try:
        for text in ("one", "two"):
            await say(daemon, conn, text)
        conversation = await daemon.store.active_conversation("terminal:local", "local")
        event, _ = await daemon.store.record_inbound("terminal", "crashed-1", "terminal:local",
                                                     "local", "left by a crash")
        stored = await daemon.gateway.agent.context.add(conversation.id, "user", "left by a crash")
        await daemon.gateway.recover()  # as the next start does with what is pending
        await until(lambda: len(conn.texts()) == 3)
        await daemon.gateway.wait_idle()
        users = [m for m in await daemon.store.list_messages(conversation.id) if m.role == "user"]
        assert [(m.id, m.token_count) for m in users][-1] == (stored.id, 4 + 4)
        assert event.received_at <= stored.created_at
    finally:
        await daemon.stop()
