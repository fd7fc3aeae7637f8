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
