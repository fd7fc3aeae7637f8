"""Background priority end to end, on the real engine (a tiny random-weight model on the embedded
model's tokenizer): a chat message that arrives while a scheduled agent job waits for the engine
is scheduled first, though it came later. Order of events, never timing."""

from __future__ import annotations

import asyncio

from engine import AsyncLLM, SamplingParams
from openclaw.backends.local import LocalBackend
from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.scheduler.agent_job import AgentJobRequest, AgentJobs
from tests.helpers.chat_model import random_chat_model
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.waiting import until

CONFIG = """
[skills]
enabled = []
[admin]
enabled = false
[access]
admins = ["terminal:local"]
allow = ["telegram:102", "telegram:103"]
[agent]
reply_max_tokens = 8
"""


class FirstTokens(LocalBackend):
    """The engine as the agent's model, noting each request's first output, in order."""

    def __init__(self, llm: AsyncLLM) -> None:
        super().__init__(llm)
        self.firsts: list[str] = []

    async def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                       cache_salt=None):
        first = True
        async for out in super().generate(prompt, params, request_id, tools=tools,
                                          priority=priority, cache_salt=cache_salt):
            if first:
                self.firsts.append(request_id)
                first = False
            yield out


async def test_a_chat_message_beats_a_waiting_agent_job_to_the_engine(tmp_path):
    folder = random_chat_model(tmp_path / "model")
    # One sequence at a time: whoever the engine's scheduler picks next runs alone, first.
    model = FirstTokens(AsyncLLM(str(folder), device="cpu", max_num_seqs=1, kv_cache_gib=0.01))
    path = tmp_path / "openclaw.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n' + CONFIG)
    tele = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=model, connectors=[RecordingConnector(), tele])
    await daemon.start()
    llm = model.llm
    try:
        # Something already holds the engine (another chat's long answer), until it is aborted.
        holding = asyncio.Event()

        async def hold() -> None:
            endless = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
            async for _ in llm.generate([1, 2, 3], endless, "holder"):
                holding.set()

        holder = asyncio.create_task(hold())
        await holding.wait()
        job = AgentJobRequest("telegram:102", "telegram", "102", "check the build", name="job")
        running = asyncio.create_task(AgentJobs(daemon.gateway).run(job))
        await until(lambda: llm.stats()["num_waiting"] == 1, timeout=60)  # the job's request
        await tele.handler(msg("hello", user="103", channel="telegram"))  # later, from a chat
        await until(lambda: llm.stats()["num_waiting"] == 2, timeout=60)
        await llm.abort("holder")
        await holder
        assert isinstance(await running, str)
        await daemon.gateway.wait_idle()
        # The chat's turn came second but ran first; the job ran after it.
        assert [rid.split("-")[0] for rid in model.firsts] == ["turn", "job"]
        assert tele.texts("103") and tele.texts("102") == []
    finally:
        await daemon.stop()
        await model.close()
