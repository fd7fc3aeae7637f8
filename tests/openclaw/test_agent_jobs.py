"""Scheduled agent jobs (openclaw/scheduler/agent_job.py): a job's turn acts as its user, with their
role; it runs at background priority; and a job told to speak only when something needs the user
sends nothing when its verdict says so."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.scheduler.agent_job import BACKGROUND, VERDICT_SYSTEM, AgentJobRequest, AgentJobs
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

PLAIN = "102"  # a Telegram user with the built-in role "user": clock, no shell
CONFIG = """
[skills]
enabled = ["clock", "shell"]
[admin]
enabled = false
[access]
admins = ["terminal:local"]
allow = ["telegram:102"]
[roles.user]
skills = ["clock"]
"""


class RecordingModel(ScriptedModel):
    """The scripted model, also noting the engine priority each call asked for."""

    def __init__(self, reply) -> None:
        super().__init__(reply)
        self.priorities: list[int] = []

    def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                 cache_salt=None):
        self.priorities.append(priority)
        return super().generate(prompt, params, request_id, tools=tools, priority=priority,
                                cache_salt=cache_salt)


async def start(tmp_path: Path, model) -> tuple[Daemon, RecordingConnector]:
    path = tmp_path / "openclaw.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n' + CONFIG)
    tele = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=model, connectors=[RecordingConnector(), tele])
    await daemon.start()
    return daemon, tele


def job(prompt: str, **kw) -> AgentJobRequest:
    return AgentJobRequest(f"telegram:{PLAIN}", "telegram", PLAIN, prompt, **kw)


def shell_then_echo(messages: list[dict]) -> str:
    """Calls shell once, then answers with what the call returned."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    tools = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
    if tools:
        return "RESULT: " + tools[-1]
    return "<tool_call>" + json.dumps({"name": "shell", "arguments": {"command": "ls"}}) + "</tool_call>"


async def test_an_agent_job_runs_with_its_users_role_and_a_denied_skill_stays_denied(tmp_path):
    model = RecordingModel(shell_then_echo)
    daemon, tele = await start(tmp_path, model)
    try:
        text = await AgentJobs(daemon.gateway).run(job("check the build"))
        assert f"denied: the role 'user' of telegram:{PLAIN} may not use 'shell'" in text
        audit = [(r.user, r.skill, r.decision) for r in await daemon.store.list_audit()]
        assert audit == [(f"telegram:{PLAIN}", "shell", "denied")]
        # Its model calls asked the engine for background priority; a chat's turn asks 0.
        assert model.priorities == [BACKGROUND, BACKGROUND]
        await tele.handler(msg("hello", user=PLAIN, channel="telegram"))
        await daemon.gateway.wait_idle()
        assert model.priorities[-1] == 0
        # The job's turn is in the chat's conversation, which the next message's turn reads.
        assert any("check the build" in str(m.get("content")) for m in model.prompts[-1])
    finally:
        await daemon.stop()


def verdict(notify: bool, message: str):
    """Answers the job with a finding, and the verdict call as told."""
    def reply(messages: list[dict]) -> str:
        if messages[0]["content"] == VERDICT_SYSTEM:
            call = {"name": "verdict", "arguments": {"notify": notify, "message": message}}
            return "<tool_call>" + json.dumps(call) + "</tool_call>"
        return "The build is green."
    return reply


async def test_a_job_whose_verdict_says_silent_sends_nothing(tmp_path):
    model = RecordingModel(verdict(False, ""))
    daemon, tele = await start(tmp_path, model)
    try:
        jobs = AgentJobs(daemon.gateway)
        assert await jobs.run(job("tell me only if the build broke", only_if_attention=True)) is None
        assert len(model.prompts) == 2  # the turn, then the verdict
        assert model.priorities == [BACKGROUND, BACKGROUND]
        assert tele.sent == []
        # Without the condition the answer itself is delivered, with no verdict asked.
        assert await jobs.run(job("how is the build?")) == "The build is green."
        assert len(model.prompts) == 3
    finally:
        await daemon.stop()


async def test_a_job_whose_verdict_says_notify_returns_its_message(tmp_path):
    model = RecordingModel(verdict(True, "The build broke at 7:02."))
    daemon, _ = await start(tmp_path, model)
    try:
        text = await AgentJobs(daemon.gateway).run(job("tell me if it broke", only_if_attention=True))
        assert text == "The build broke at 7:02."
    finally:
        await daemon.stop()


async def test_a_job_of_a_user_no_longer_allowed_calls_no_model(tmp_path):
    model = RecordingModel(verdict(True, "x"))
    daemon, _ = await start(tmp_path, model)
    try:
        gone = AgentJobRequest("telegram:999", "telegram", "999", "check")
        assert await AgentJobs(daemon.gateway).run(gone) is None
        assert model.prompts == []
    finally:
        await daemon.stop()


async def test_stop_in_the_jobs_chat_stops_it_and_nothing_is_sent(tmp_path):
    model = RecordingModel(lambda messages: "a long look at everything")
    model.gate = asyncio.Event()  # the job's answer streams one chunk, then waits
    daemon, tele = await start(tmp_path, model)
    try:
        running = asyncio.create_task(AgentJobs(daemon.gateway).run(job("look at everything")))
        await until(lambda: model.generated > 0)
        await tele.handler(msg("/stop", user=PLAIN, channel="telegram"))
        async with asyncio.timeout(60):  # a guard: without the /stop it would wait forever
            assert await running is None
        await daemon.gateway.outbox.settled("telegram", PLAIN)
        assert tele.texts(PLAIN) == ["Stopped."]
    finally:
        await daemon.stop()


async def test_a_job_queued_when_the_daemon_starts_draining_is_left_not_run(tmp_path):
    model = RecordingModel(lambda messages: "an answer")
    model.gate = asyncio.Event()  # the chat's turn streams one chunk, then waits
    daemon, tele = await start(tmp_path, model)
    try:
        await tele.handler(msg("hello", user=PLAIN, channel="telegram"))
        await until(lambda: model.generated > 0)
        queued = asyncio.create_task(AgentJobs(daemon.gateway).run(job("check")))  # behind it
        await until(lambda: daemon.gateway.lanes.queued() == 1)
        daemon.gateway.lanes.accepting = False  # as a drain begins
        model.gate.set()
        async with asyncio.timeout(60):  # a guard only
            assert await queued is None
        assert len(model.prompts) == 1  # the chat's turn only
    finally:
        await daemon.stop()
