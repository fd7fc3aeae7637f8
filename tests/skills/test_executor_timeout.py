"""A skill that outlives the executor's time limit: the model is told the action was abandoned and
may still complete (work in a worker thread cannot be interrupted), and the audit row says so."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from sandbox.policy import Policy, Role
from sandbox.runner import Sandbox
from sandbox.scope import Limits
from skills import Skill
from skills.executor import Executor
from skills.registry import SkillRegistry


class SlowWrite(Skill):
    """Writes a file from a worker thread after a delay, the way the files skill works."""
    name = "slow_write"
    description = "Writes a marker file slowly."
    parameters = {"type": "object", "properties": {}}

    def __init__(self, path, release: threading.Event) -> None:
        self.path, self.release = path, release

    async def run(self, args: dict[str, Any], ctx) -> str:
        def work() -> str:
            self.release.wait(10)
            self.path.write_text("written")
            return "done"
        return await asyncio.to_thread(work)


async def test_a_timed_out_thread_skill_is_reported_as_possibly_completing(tmp_path):
    release = threading.Event()
    marker = tmp_path / "marker"
    audit: list[dict[str, Any]] = []

    async def sink(user, skill, args, decision, **extra):
        audit.append({"decision": decision, **extra})

    policy = Policy({"r": Role("r", skills=frozenset({"slow_write"}))}, tmp_path, lambda user: "r")
    executor = Executor(SkillRegistry([SlowWrite(marker, release)]), Sandbox(), audit=sink, timeout_s=0.2)
    outcome = await executor.call("slow_write", {}, policy.principal("telegram:1"))
    assert not outcome.ok
    assert "did not finish within 0.2 s" in outcome.text and "may still complete" in outcome.text
    assert audit[-1]["decision"] == "allowed" and "may still complete" in audit[-1]["detail"]
    # And it does complete: exactly what the message warned about.
    release.set()
    for _ in range(100):
        if marker.exists() and marker.read_text() == "written":  # created, then written
            break
        await asyncio.sleep(0.05)
    assert marker.read_text() == "written"


class UpstreamTimeout(Skill):
    """Fails at once with its own TimeoutError (a socket's, say): nothing is left running."""
    name = "upstream"
    description = "Calls an API that times out."
    parameters = {"type": "object", "properties": {}}

    async def run(self, args: dict[str, Any], ctx) -> str:
        raise TimeoutError("upstream API read timed out")


async def test_a_skill_raising_its_own_timeout_is_a_plain_failure_not_an_abandoned_run(tmp_path):
    policy = Policy({"r": Role("r", skills=frozenset({"upstream"}))}, tmp_path, lambda user: "r")
    executor = Executor(SkillRegistry([UpstreamTimeout()]), Sandbox(), timeout_s=60)
    outcome = await executor.call("upstream", {}, policy.principal("telegram:1"))
    assert not outcome.ok
    assert outcome.text == "error: upstream failed: TimeoutError: upstream API read timed out"


class OwnClock(Skill):
    """Keeps to the role's wall-clock limit itself, like the shell: nothing outlives a cancel."""
    name = "own_clock"
    description = "Sleeps as long as asked."
    parameters = {"type": "object", "properties": {"s": {"type": "number"}}}
    keeps_wall_clock = True

    async def run(self, args: dict[str, Any], ctx) -> str:
        await asyncio.sleep(args["s"])
        return "slept"


async def test_a_skill_that_keeps_the_roles_wall_clock_gets_it_and_is_said_stopped(tmp_path, monkeypatch):
    import skills.executor

    # The role's limit, 1.5 s with its grace, is far from the 0.3 s sleep below: a loaded
    # machine's slow loop must not make that sleep outlast it.
    monkeypatch.setattr(skills.executor, "WALL_CLOCK_GRACE_S", 0.5)
    role = Role("r", skills=frozenset({"own_clock"}), limits=Limits(wall_seconds=1))
    policy = Policy({"r": role}, tmp_path, lambda user: "r")
    executor = Executor(SkillRegistry([OwnClock()]), Sandbox(), timeout_s=0.1)
    principal = policy.principal("telegram:1")
    # Longer than agent.tool_timeout_s, within the role's own limit: the role's limit decides.
    assert (await executor.call("own_clock", {"s": 0.3}, principal)).text == "slept"
    hung = await executor.call("own_clock", {"s": 30}, principal)
    assert hung.text == "error: own_clock did not finish within 1.5 s and was stopped"
