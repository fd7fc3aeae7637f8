"""The priority gate in front of a remote model (openclaw/scheduler/priority_gate.py): a scheduled
job's request waits while a chat's request runs, and starts once it ends."""

from __future__ import annotations

import asyncio

from openclaw.scheduler.priority_gate import PriorityGate
from tests.helpers.scripted_model import ScriptedModel, last_user
from tests.openclaw.test_agent_jobs import start


async def drain(model, text: str, priority: int) -> str:
    outs = [out async for out in model.generate([{"role": "user", "content": text}],
                                                 priority=priority)]
    return outs[-1].text


async def test_a_background_request_waits_for_the_chats_request_to_end():
    remote = ScriptedModel(last_user)
    remote.gate = asyncio.Event()  # the chat's answer streams one chunk, then waits
    gated = PriorityGate(remote)
    chat = asyncio.create_task(drain(gated, "a chat message", 0))
    while not remote.prompts:  # the chat's request reached the server
        await asyncio.sleep(0)
    job = asyncio.create_task(drain(gated, "a scheduled job", 10))
    for _ in range(50):  # the job gets every chance to start; it must not
        await asyncio.sleep(0)
    assert [last_user(p) for p in remote.prompts] == ["a chat message"]
    remote.gate.set()
    assert await chat == "a chat message"
    assert await job == "a scheduled job"
    assert [last_user(p) for p in remote.prompts] == ["a chat message", "a scheduled job"]
    # With no chat running, a background request goes at once; a chat's never waits.
    assert await drain(gated, "another job", 10) == "another job"


async def test_the_daemon_gates_the_agents_model_unless_it_is_the_engine(tmp_path):
    daemon, _ = await start(tmp_path, ScriptedModel(last_user))  # stands for a remote model
    try:
        assert isinstance(daemon.gateway.agent.model, PriorityGate)
    finally:
        await daemon.stop()


async def test_the_daemon_gates_a_model_unless_it_runs_requests_by_priority_itself(tmp_path):
    from tests.helpers.daemon import started
    from tests.helpers.scripted_model import echo

    for orders in (False, True):
        model = ScriptedModel(echo)
        model.orders_by_priority = orders  # as the engine's LocalBackend says of itself
        (tmp_path / str(orders)).mkdir()
        daemon, _ = await started(tmp_path / str(orders), model)
        try:
            in_front = daemon.gateway.agent.model
            assert isinstance(in_front, PriorityGate) is not orders
            assert (in_front.model if not orders else in_front) is model
        finally:
            await daemon.stop()
