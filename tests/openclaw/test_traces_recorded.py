"""Every agent turn leaves one trace, written after its reply is handed to the outbox: its
messages, tool calls and errors, model, sampling, timings and how it ended."""

from __future__ import annotations

from openclaw.scheduler.agent_job import AgentJobRequest, AgentJobs
from openclaw.store.trace_records import TraceStatus
from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel

CLOCK = '<tool_call>{"name": "clock", "arguments": {"timezone": "UTC"}}</tool_call>'
UNKNOWN = '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'


def call_then_answer(call: str):
    def reply(messages: list[dict]) -> str:
        return "It is late." if messages[-1]["role"] == "tool" else call
    return reply


async def test_a_turn_with_a_tool_call_is_traced_with_its_messages(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(call_then_answer(CLOCK)))
    try:
        await say(daemon, conn, "what time is it?")
        store = daemon.store
        [trace] = await store.list_traces()
        messages = (await store.trace_messages([trace]))[trace.id]
    finally:
        await daemon.stop()
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[0].content == "what time is it?" and messages[-1].content == "It is late."
    assert (trace.user, trace.status, trace.steps, trace.tool_calls, trace.tool_errors,
            trace.last_tool_failed, trace.reply_chars) == (
        "terminal:local", TraceStatus.ANSWERED, 2, 1, 0, False, len("It is late."))
    assert trace.inbound_event_id is not None and trace.model == "scripted"
    assert trace.sampling["chat"]["temperature"] == 0.0 and trace.sampling["max_tokens"] > 0
    assert trace.first_token_ms is not None and trace.duration_ms >= trace.first_token_ms


async def test_a_failed_last_tool_call_is_counted(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(call_then_answer(UNKNOWN)))
    try:
        await say(daemon, conn, "do the thing")
        await say(daemon, conn, "again")
        traces = await daemon.store.list_traces()
    finally:
        await daemon.stop()
    assert len(traces) == 2  # one per turn
    assert all((t.tool_calls, t.tool_errors, t.last_tool_failed) == (1, 1, True) for t in traces)


async def test_a_scheduled_agent_jobs_turn_is_traced_without_an_inbound_message(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(call_then_answer(CLOCK)))
    try:
        answer = await AgentJobs(daemon.gateway).run(
            AgentJobRequest("terminal:local", "terminal", "local", "what time is it?"))
        [trace] = await daemon.store.list_traces()
        messages = (await daemon.store.trace_messages([trace]))[trace.id]
    finally:
        await daemon.stop()
    assert answer == "It is late."
    assert (trace.inbound_event_id, trace.tool_calls, trace.status) == (None, 1, "answered")
    assert messages[0].content.endswith("what time is it?") and messages[-1].content == answer


async def test_private_on_keeps_no_trace_and_off_traces_again(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(call_then_answer(CLOCK)))
    try:
        assert (await say(daemon, conn, "/private")).startswith("Private is off")
        await say(daemon, conn, "before")
        assert (await say(daemon, conn, "/private on")).startswith("Private is on")
        assert (await say(daemon, conn, "/private")).startswith("Private is on")
        await say(daemon, conn, "while private")
        assert len(await daemon.store.list_traces(include_private=True)) == 1
        assert await daemon.store.list_traces() == []  # the earlier one is not exportable now
        assert (await say(daemon, conn, "/private maybe")).startswith("Use /private on")
        assert (await say(daemon, conn, "/private off")).startswith("Private is off")
        await say(daemon, conn, "after")
        traces = await daemon.store.list_traces()
        firsts = [(await daemon.store.trace_messages([t]))[t.id][0].content for t in traces]
    finally:
        await daemon.stop()
    assert firsts == ["before", "after"]


async def test_the_trace_is_written_after_the_reply_is_in_the_outbox_and_cannot_fail_the_turn(
        tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(call_then_answer(CLOCK)))
    store, seen = daemon.store, []
    recorded = store.add_trace

    async def after_the_reply(**values):
        async with store.engine.connect() as db:  # the reply to this message, stored already?
            seen.append((await db.exec_driver_sql(
                "SELECT count(*) FROM outbound_messages WHERE inbound_event_id = ?",
                (values["inbound_event_id"],))).scalar())
        if len(seen) == 2:
            raise OSError("the disk is full")  # a trace that cannot be written
        return await recorded(**values)

    store.add_trace = after_the_reply
    try:
        assert await say(daemon, conn, "first") == "🔧 clock: UTC — ok\n\nIt is late."
        assert await say(daemon, conn, "second") == "🔧 clock: UTC — ok\n\nIt is late."
        assert await say(daemon, conn, "third") == "🔧 clock: UTC — ok\n\nIt is late."
        traces = await store.list_traces()
        pending = await store.pending_inbound()
    finally:
        await daemon.stop()
    assert seen == [1, 1, 1] and len(traces) == 2 and pending == []


async def test_a_turns_usage_is_counted_once_with_its_trace_without_one_and_when_it_fails(
        tmp_path):
    # The usage goes in the trace's transaction: a private user's turn (no trace) and a trace the
    # store refuses still count what the turn spent, and a traced turn counts it once.
    daemon, conn = await started(tmp_path, ScriptedModel(call_then_answer(CLOCK)))
    store, spent = daemon.store, []
    recorded = store.add_trace

    async def failing_second(**values):
        if len(spent) == 1:
            raise OSError("the disk is full")
        return await recorded(**values)

    store.add_trace = failing_second
    try:
        for text in ("traced", "not traced: the store refuses", "/private on", "private"):
            await say(daemon, conn, text)
            if not text.startswith("/"):
                spent.append(await store.tokens_today("terminal:local"))
        traces = await store.list_traces(include_private=True)
        async with store.engine.connect() as db:
            rows = (await db.exec_driver_sql("SELECT count(*) FROM usage")).scalar()
    finally:
        await daemon.stop()
    assert len(traces) == 1 and 0 < spent[0] < spent[1] < spent[2]
    assert rows == 3  # one per turn: none lost, none twice
