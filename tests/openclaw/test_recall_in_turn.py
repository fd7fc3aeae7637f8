"""A turn recalls the user's memory once its message fit the budget, in the turn's own task (the
store reads it on the loop's connection: store/memory.py); a message too long is refused before
any recall, and never stored."""

from __future__ import annotations

from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel


async def test_a_message_too_long_is_refused_without_a_recall_and_the_next_is_recalled_for(
        tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "An answer."),
                                 "context_tokens = 300\nreply_max_tokens = 100\n")
    memory = daemon.memory
    recall, recalled = memory.recall, []

    async def recall_noted(user, scope, query):
        recalled.append(query)
        return await recall(user, scope, query)

    memory.recall = recall_noted
    try:
        reply = await say(daemon, conn, "word " * 400)
        assert reply.startswith("Sorry, that message is too long for me (200 tokens at most")
        assert await daemon.store.list_messages(1) == []  # never stored
        assert recalled == []
        assert await say(daemon, conn, "hello") == "An answer."
        assert recalled == ["hello"]
    finally:
        await daemon.stop()
