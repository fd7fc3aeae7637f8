"""A turn stopped while a tool runs stores a result for the call that says so: it may have done
part of its work. Without one the prompt said "not run" (a model shown a bare call may take it as
done, or make a result up), false for a command cut short. Real daemon and SQLite; a scripted
model."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from skills.base import Skill, SkillContext
from tests.helpers.daemon import msg, say, started
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

EXTRA = """
[skills]
enabled = ["tests.openclaw.test_stopped_calls:Slow", "tests.openclaw.test_stopped_calls:Mark"]
"""
RAN: list[str] = []  # the test skills' runs, in order


class Slow(Skill):
    """Test only: never finishes; the test stops the turn while it runs."""

    name = "slow"
    description = "Test only: a tool that takes forever."
    parameters = {"type": "object", "properties": {}}
    running = asyncio.Event()

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        RAN.append(self.name)
        Slow.running.set()
        await asyncio.Event().wait()
        return "never"


class Mark(Skill):
    """Test only: says that it ran."""

    name = "mark"
    description = "Test only: a tool that returns at once."
    parameters = {"type": "object", "properties": {}}

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        RAN.append(self.name)
        return "marked"


def call(name: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {}}) + "</tool_call>"


def script(messages: list[dict]) -> str:
    if messages[-1]["role"] == "user" and messages[-1]["content"] == "start":
        return "<tool_call>" + json.dumps({"name": "slow", "arguments": {}}) + "</tool_call>"
    return "ok"


async def test_a_call_stopped_while_it_ran_shows_as_stopped_in_the_next_prompt(tmp_path):
    Slow.running = asyncio.Event()
    model = ScriptedModel(script)
    daemon, conn = await started(tmp_path, model, EXTRA)
    try:
        await conn.handler(msg("start"))
        await until(Slow.running.is_set)
        await conn.handler(msg("/stop"))
        await daemon.gateway.wait_idle()
        assert await say(daemon, conn, "and now?") == "ok"
        prompt = model.prompts[-1]
        called = next(m for m in prompt if m.get("tool_calls"))
        call_id = called["tool_calls"][0]["id"]
        after = prompt[prompt.index(called) + 1]
        assert after["role"] == "tool" and after["tool_call_id"] == call_id
        assert after["content"].startswith("error: stopped:") and "may have done" in after["content"]
        assert "not run" not in after["content"]
        assert prompt[-1] == {"role": "user", "content": "and now?"}
        # The stopped turn's trace runs to the stopped call's result, its last message.
        stopped = next(t for t in await daemon.store.list_traces() if t.status == "stopped")
        [kept] = (await daemon.store.trace_messages([stopped]))[stopped.id][-1:]
        assert kept.role == "tool" and kept.content.startswith("error: stopped:")
    finally:
        await daemon.stop()


async def _stopped_then_started(tmp_path, script) -> tuple[ScriptedModel, list]:
    """"start" sent, the daemon stopped while `slow` runs, with too short a drain to wait for
    it (the turn is taken up at the next start), then started again; the second run's model and
    the store's audit, once the turn is answered."""
    Slow.running = asyncio.Event()
    RAN.clear()
    daemon, conn = await started(tmp_path, ScriptedModel(script), EXTRA)
    await conn.handler(msg("start"))
    await until(Slow.running.is_set)
    await daemon.stop(drain_timeout=0.1)
    model = ScriptedModel(script)
    daemon, conn = await started(tmp_path, model, EXTRA)
    try:
        await daemon.gateway.wait_idle()
        await until(lambda: conn.sent)
        assert conn.sent[-1][1] == "ok"
        return model, list(reversed(await daemon.store.list_audit()))
    finally:
        await daemon.stop()


async def test_calls_after_one_a_stop_cut_short_are_shown_as_not_run_when_the_turn_is_taken_up(
        tmp_path):
    """The step's calls run in order: after the stopped `slow`, `mark` never began. Taken up at
    the next start, neither is run again, `slow` reads as stopped, `mark` as not run (not as
    "interrupted, may have run", which would keep a careful model from doing it), and the
    audit has no row for `mark`."""
    def script(messages: list[dict]) -> str:
        return call("slow") + call("mark") if messages[-1]["content"] == "start" else "ok"

    model, audit = await _stopped_then_started(tmp_path, script)
    assert RAN == ["slow"]
    results = [m["content"] for m in model.prompts[-1] if m["role"] == "tool"]
    assert len(results) == 2
    assert results[0].startswith("error: stopped:") and "not run" in results[1]
    assert [(a.skill, a.decision) for a in audit] == [("slow", "allowed")]


async def test_a_turn_with_a_malformed_call_step_is_taken_up_not_run_again(tmp_path):
    """A step whose only call was malformed is stored without calls, its error after it. Taken
    up at the next start, the turn goes on from its steps: the user's message is not stored a
    second time and `slow`, which the stop cut short, is not run again."""
    def script(messages: list[dict]) -> str:
        last = messages[-1]
        if last["content"] == "start":
            return '<tool_call>{"name": "slow", "arguments": {oops</tool_call>'
        if last["role"] == "tool" and "incomplete JSON" in last["content"]:
            return call("slow")
        return "ok"

    model, _ = await _stopped_then_started(tmp_path, script)
    assert RAN == ["slow"]
    prompt = model.prompts[-1]
    assert [m["content"] for m in prompt if m["role"] == "user"] == ["start"]
    assert prompt[-1]["role"] == "tool" and prompt[-1]["content"].startswith("error: stopped:")


async def test_a_request_to_approve_stopped_while_it_is_stored_is_never_sent(tmp_path,
                                                                               monkeypatch):
    """/stop while the request is being stored: the store call ends whole, and the outbox retries
    what a cancelled send left pending. The request is given up instead: sent after "Stopped.",
    it named a number no longer waiting ("There is no request N")."""
    from openclaw.store import Store

    add, storing, stopped = Store._add_outbound, asyncio.Event(), asyncio.Event()

    async def slowly(self, session, channel, chat_id, pieces, *args, **kwargs):
        if any("Approval needed" in piece for piece in pieces):
            storing.set()
            # Held until the /stop is handled, however long that takes on a loaded machine;
            # only a /stop that never returns lets it go on by itself, for the asserts to say so.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), timeout=30)
        return await add(self, session, channel, chat_id, pieces, *args, **kwargs)

    monkeypatch.setattr(Store, "_add_outbound", slowly)
    RAN.clear()
    extra = EXTRA + '[roles.admin]\napproval = ["mark"]\n'
    script = lambda m: call("mark") if m[-1]["content"] == "start" else "ok"  # noqa: E731
    daemon, conn = await started(tmp_path, ScriptedModel(script), extra)
    try:
        await conn.handler(msg("start"))
        await until(storing.is_set)
        await conn.handler(msg("/stop"))  # returns once the turn was cancelled and "Stopped." sent
        stopped.set()
        await daemon.gateway.wait_idle()
        await daemon.gateway.outbox.wait_delivered()  # a retry, had one been started, is done
        assert [text for _, text in conn.sent] == ["Stopped."]
        assert RAN == []
        given_up = [o for o in await daemon.store.list_outbound() if "Approval needed" in o.text]
        assert [o.status for o in given_up] == ["failed"]
    finally:
        await daemon.stop()
