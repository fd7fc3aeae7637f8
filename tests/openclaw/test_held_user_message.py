"""A turn holds its user's message (ContextBuilder.hold) and stores it with its first step or
answer, one commit for both (openclaw/agent/loop.py): in the prompt from the start, in the store
once the turn stored something, and stored alone when the turn ends before that (stopped, failed).
Real daemon and SQLite (the loop's writer); a scripted model."""

from __future__ import annotations

import asyncio

import pytest

from openclaw.agent.context import Budget, ContextBuilder
from openclaw.agent.loop import APOLOGY
from openclaw.store import Store
from openclaw.store.records import MessageRole
from tests.helpers.daemon import msg, say, started
from tests.helpers.scripted_model import ScriptedModel, echo
from tests.helpers.waiting import until

EXTRA = '[skills]\nenabled = ["clock"]\n'


async def _stored(daemon) -> list:
    conversation = await daemon.store.active_conversation("terminal:local", "local")
    return await daemon.store.list_messages(conversation.id)


async def test_the_users_message_and_the_answer_are_stored_in_one_commit(tmp_path):
    seen: list[tuple[int, list]] = []  # the writer's commits and the stored messages, per call
    model = ScriptedModel(echo)
    daemon, conn = await started(tmp_path, model)
    writer = daemon.store.loop_writer
    stored_at_call = []

    def reply(messages: list[dict]) -> str:
        seen.append((writer.commits, messages))
        return echo(messages)

    model.reply = reply
    send = conn.send_text

    async def sending(chat_id: str, text: str) -> str:
        stored_at_call.append(writer.commits)
        return await send(chat_id, text)

    conn.send_text = sending
    try:
        await say(daemon, conn, "warm up")  # the conversation, its counts: made once
        seen.clear(), stored_at_call.clear()
        before = writer.commits
        assert await say(daemon, conn, "hello there") == "re: hello there"
        stored = (await _stored(daemon))[2:]
        traces = await daemon.store.list_traces()
    finally:
        await daemon.stop()
    (commits, prompt), = seen
    assert prompt[-1] == {"role": "user", "content": "hello there"}  # in the prompt, held
    # Before the model's call only the inbound message was stored; then the user's message and
    # the answer in one commit, and the reply (marking the message answered) in the next.
    assert (commits - before, stored_at_call[0] - before) == (1, 3)
    user, answer = stored
    assert (user.role, user.content, answer.content) == ("user", "hello there", "re: hello there")
    assert answer.id == user.id + 1
    assert user.id in [trace.first_message_id for trace in traces]


async def test_a_message_stopped_before_its_first_step_is_stored_and_read_next_turn(tmp_path):
    model = ScriptedModel(lambda messages: "  ".join(m["content"] for m in messages
                                                     if m["role"] == "user"))
    model.gate = asyncio.Event()  # the first answer streams one chunk, then waits
    daemon, conn = await started(tmp_path, model)
    try:
        await conn.handler(msg("first question"))
        await until(lambda: model.generated > 0)
        assert await _stored(daemon) == []  # held: nothing stored while the model answers
        await conn.handler(msg("/stop"))
        await daemon.gateway.wait_idle()
        assert [(m.role, m.content) for m in await _stored(daemon)] == [("user", "first question")]
        model.gate = None
        assert await say(daemon, conn, "second") == "first question  second"
        (stopped,) = [t for t in await daemon.store.list_traces() if t.status == "stopped"]
        user = (await _stored(daemon))[0]
        assert stopped.first_message_id == user.id
        # Counted once its turn ended, as an answered message is.
        assert (await _stored(daemon))[0].token_count is not None
    finally:
        await daemon.stop()


async def test_a_turn_that_fails_before_storing_anything_still_stores_the_message(tmp_path):
    def broken(messages: list[dict]) -> str:
        raise RuntimeError("the model broke")

    daemon, conn = await started(tmp_path, ScriptedModel(broken))
    try:
        assert await say(daemon, conn, "are you there?") == APOLOGY
        assert [(m.role, m.content) for m in await _stored(daemon)] == [
            ("user", "are you there?")]
    finally:
        await daemon.stop()


async def test_a_held_message_stays_last_in_the_prompt_through_a_compaction(tmp_path):
    # A small context: the turn's first prompt needs a summary of the turns before it, made and
    # stored while its message is held; the summary covers stored messages only.
    def reply(messages: list[dict]) -> str:
        if "You write the memory" in messages[0]["content"]:
            return "summary of the earlier talk"
        return "ok " + "x " * 30

    model = ScriptedModel(reply, max_model_len=400)
    daemon, conn = await started(tmp_path, model, "context_tokens = 400\n"
                                 "reply_max_tokens = 64\ncompaction_keep_messages = 2\n")
    try:
        for i in range(8):
            await say(daemon, conn, f"question number {i} " + "word " * 20)
        stored = await _stored(daemon)
        conversation = await daemon.store.active_conversation("terminal:local", "local")
        summary = await daemon.store.latest_summary(conversation.id)
    finally:
        await daemon.stop()
    assert summary is not None
    users = [m for m in stored if m.role == "user"]
    assert [m.content.split()[2] for m in users] == [str(i) for i in range(8)]
    assert summary.up_to_message_id < users[-1].id  # the held message was not summarised
    answered = [p for p in model.prompts if "You write the memory" not in p[0]["content"]]
    # Each turn's prompt ends with its own message, held while the compaction ran.
    assert [p[-1]["content"].split()[2] for p in answered] == [str(i) for i in range(8)]


async def test_a_held_message_survives_its_history_being_dropped_and_read_again(tmp_path):
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True)
    try:
        await store.ensure_user("terminal", "local")
        conversation = (await store.active_conversation("terminal:local", "local")).id
        await store.add_message(conversation, "user", "before")
        model = ScriptedModel(echo)
        context = ContextBuilder(model, store, "system", Budget(prompt_tokens=3000,
                                                                keep_messages=2))
        await context.history(conversation)
        held = context.hold(conversation, "user", "now")
        context._forget(conversation)  # evicted (another conversation's turn), or compacted
        _, history = await context.history(conversation)
        assert [m.content for m in history] == ["before", "now"]
        assert await store.list_messages(conversation) and held.stored is None
        answer = await context.add(conversation, "assistant", "done")
        _, history = await context.history(conversation)
        stored = await store.list_messages(conversation)
        assert [(m.id, m.content) for m in history] == [(m.id, m.content) for m in stored]
        assert [m.content for m in stored] == ["before", "now", "done"]
        assert held.stored == stored[1] and answer == stored[2]
        assert stored[1].role is MessageRole.USER
        await context.flush(conversation)  # nothing held: nothing stored
        assert len(await store.list_messages(conversation)) == 3
    finally:
        await store.close()


async def _context_over(tmp_path, history: list[str]) -> tuple[Store, ContextBuilder, int]:
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}", loop_writes=True)
    await store.ensure_user("terminal", "local")
    conversation = (await store.active_conversation("terminal:local", "local")).id
    for text in history:
        await store.add_message(conversation, "user", text)
    context = ContextBuilder(ScriptedModel(echo), store, "system",
                             Budget(prompt_tokens=3000, keep_messages=2))
    await context.history(conversation)
    return store, context, conversation


async def test_a_held_message_whose_write_failed_is_stored_by_the_flush(tmp_path):
    store, context, conversation = await _context_over(tmp_path, ["now"])
    try:
        held = context.hold(conversation, "user", "now")  # the same text as the one before
        add_messages = store.add_messages

        async def refused(*args, **kwargs):
            store.add_messages = add_messages
            raise OSError("disk full")

        store.add_messages = refused
        with pytest.raises(OSError):
            await context.add(conversation, "assistant", "the answer")
        await context.flush(conversation)
        stored = await store.list_messages(conversation)
        assert [m.content for m in stored] == ["now", "now"]  # stored once, not lost
        assert held.stored == stored[1]
        _, history = await context.history(conversation)
        assert history == stored
    finally:
        await store.close()


async def test_a_held_message_whose_write_was_cut_after_its_commit_is_not_stored_twice(tmp_path):
    store, context, conversation = await _context_over(tmp_path, ["before"])
    try:
        held = context.hold(conversation, "user", "now")
        add_messages = store.add_messages

        async def cancelled_as_it_ends(*args, **kwargs):
            store.add_messages = add_messages
            await add_messages(*args, **kwargs)  # committed; the caller's cancel comes now
            raise asyncio.CancelledError

        store.add_messages = cancelled_as_it_ends
        with pytest.raises(asyncio.CancelledError):
            await context.add(conversation, "assistant", "the answer")
        await context.flush(conversation)
        stored = await store.list_messages(conversation)
        assert [m.content for m in stored] == ["before", "now", "the answer"]
        assert held.stored == stored[1]
        _, history = await context.history(conversation)
        assert history == stored
    finally:
        await store.close()
