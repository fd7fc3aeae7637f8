"""A user with no memory entries costs their turns no recall from the store; an entry kept
later is recalled from the next turn on."""

from __future__ import annotations

from openclaw.agent.memory import MEMORY_HEADER
from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel


async def test_no_entries_no_recall_until_one_is_kept(tmp_path):
    model = ScriptedModel(lambda m: "An answer.")
    daemon, conn = await started(tmp_path, model)
    store = daemon.store
    recall, recalled = store.recall, []

    async def noted(*args, **kwargs):
        recalled.append(args)
        return await recall(*args, **kwargs)

    store.recall = noted
    try:
        await say(daemon, conn, "hello")  # found empty, and counted: nothing there
        assert len(recalled) == 1
        await say(daemon, conn, "hello again")
        assert len(recalled) == 1, "the store was asked again for a user with no entries"
        assert not any(MEMORY_HEADER in m["content"] for m in model.prompts[-1])
        await daemon.memory.remember("terminal:local", "local", False, "likes tea", pinned=True)
        await say(daemon, conn, "what do I like?")
        assert len(recalled) == 2
        assert any(MEMORY_HEADER in m["content"] and "likes tea" in m["content"]
                   for m in model.prompts[-1])
    finally:
        await daemon.stop()
