"""A scheduled agent job on an OpenAI-compatible server (the fake, on the real wire protocol): its
verdict is asked as a call of the verdict tool, which the server is told to make (a named
tool_choice), and a silent verdict sends nothing."""

from __future__ import annotations

from openclaw.scheduler.agent_job import VERDICT_TOOL, AgentJobRequest, AgentJobs
from openclaw.scheduler.priority_gate import PriorityGate
from tests.backends.test_daemon_on_a_server import on
from tests.fakes.openai_api import Reply, replies
from tests.helpers.daemon import started


async def test_a_jobs_verdict_is_a_named_tool_call_on_the_server_and_silent_sends_nothing(
        tmp_path, fake):
    fake.reply = replies("Nothing new in the inbox.",
                         Reply(tool_calls=[(VERDICT_TOOL, {"notify": False, "message": ""})]),
                         "Mail from the bank.",
                         Reply(tool_calls=[(VERDICT_TOOL, {"notify": True,
                                                           "message": "The bank wrote."})]))
    daemon, conn = await started(tmp_path, None, on(fake))
    try:
        assert isinstance(daemon.gateway.agent.model, PriorityGate)  # queued behind chats
        job = AgentJobRequest("terminal:local", "terminal", "local", "read my inbox",
                              only_if_attention=True)
        jobs = AgentJobs(daemon.gateway)
        assert await jobs.run(job) is None
        assert await jobs.run(job) == "The bank wrote."
        verdict = fake.chats[1]
        assert verdict["tool_choice"] == {"type": "function", "function": {"name": VERDICT_TOOL}}
        assert [t["function"]["name"] for t in verdict["tools"]] == [VERDICT_TOOL]
        assert "Nothing new in the inbox." in verdict["messages"][-1]["content"]
        assert conn.sent == []
    finally:
        await daemon.stop()
