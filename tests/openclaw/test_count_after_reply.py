"""The user's message is stored without its token count, which is stored once the reply is out
(Agent.count_later): far from the budget the prompt takes the message at its bound, so the reply
waits for no encoding of it (openclaw/agent/loop.py, agent/context.py fits_alone)."""

from __future__ import annotations

from typing import Any

import pytest

from openclaw.store import Store
from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel


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
