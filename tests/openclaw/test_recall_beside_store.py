"""A turn recalls the user's memory while it stores their message: two store calls at once, so
the reply does not wait for one after the other."""

from __future__ import annotations

import asyncio

from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel

WAIT_S = 10.0


async def test_the_memory_is_recalled_while_the_message_is_stored(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "An answer."))
    recalling = asyncio.Event()
    memory, store = daemon.memory, daemon.store
    recall, add_message = memory.recall, store.add_message

    async def recall_noted(*args, **kwargs):
        recalling.set()
        return await recall(*args, **kwargs)

    async def add_once_recalling(conversation_id, role, content, **kwargs):
        if role == "user":  # stored only once the recall began: they overlap, or this times out
            await asyncio.wait_for(recalling.wait(), WAIT_S)
        return await add_message(conversation_id, role, content, **kwargs)

    memory.recall, store.add_message = recall_noted, add_once_recalling
    try:
        assert await say(daemon, conn, "hello") == "An answer."
        assert [m.role for m in await store.list_messages(1)] == ["user", "assistant"]
    finally:
        await daemon.stop()


class RecallFirst(ScriptedModel):
    """Counts a prompt only once the recall began (or times out): the recall does not wait for
    the message's check against the budget either."""

    def __init__(self, recalling: asyncio.Event) -> None:
        super().__init__(lambda m: "An answer.")
        self.recalling = recalling

    async def count_chat(self, messages, tools=None) -> int:
        await asyncio.wait_for(self.recalling.wait(), WAIT_S)
        return await super().count_chat(messages, tools)


async def test_the_memory_is_recalled_while_the_message_is_checked_against_the_budget(tmp_path):
    recalling = asyncio.Event()
    daemon, conn = await started(tmp_path, RecallFirst(recalling))
    memory = daemon.memory
    recall = memory.recall

    async def recall_noted(*args, **kwargs):
        recalling.set()
        return await recall(*args, **kwargs)

    memory.recall = recall_noted
    try:
        assert await say(daemon, conn, "hello") == "An answer."
    finally:
        await daemon.stop()


async def test_a_message_too_long_is_refused_and_its_recall_ended(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "An answer."),
                                 "context_tokens = 300\nreply_max_tokens = 100\n")
    try:
        reply = await say(daemon, conn, "word " * 400)
        assert reply.startswith("Sorry, that message is too long for me (200 tokens at most")
        assert await daemon.store.list_messages(1) == []  # never stored
        assert await say(daemon, conn, "hello") == "An answer."
    finally:
        await daemon.stop()
