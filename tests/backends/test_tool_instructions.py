"""`tool_instructions` through the agent's model interface: the engine in this process renders and
counts the tools' section with it; an OpenAI-compatible server is sent it as an extra field only
when set (`openclaw serve` reads it, tests/serve/test_tool_instructions.py), and a strict server
that refuses the field gets the request without it."""

from __future__ import annotations

from contextlib import aclosing

import pytest

from engine import SamplingParams
from engine.config import EngineConfig
from openclaw.backends import open_backend
from openclaw.backends.openai import OpenAIBackend
from openclaw.config import OpenAIEngineConfig
from tests.fakes.openai_api import MODEL, FakeOpenAI

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Time?"}]
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}}
MINE = "You may call these, one JSON object a line:\n{tools}\nCall one only when asked."


async def last_output(model, **kw):
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    async with aclosing(model.generate(CHAT, params, tools=[CLOCK], **kw)) as stream:
        return [out async for out in stream][-1]


async def test_the_local_engine_counts_the_prompt_it_generates_from():
    backend = await open_backend(EngineConfig(device="cpu", kv_cache_gib=0.02, max_model_len=1024))
    try:
        built_in = await backend.count_chat(CHAT, [CLOCK])
        mine = await backend.count_chat(CHAT, [CLOCK], MINE)
        assert mine != built_in
        assert (await last_output(backend, tool_instructions=MINE)).prompt_tokens == mine
        assert (await last_output(backend)).prompt_tokens == built_in
        with pytest.raises(ValueError, match=r"tool_instructions: .*\{tools\}"):
            await backend.count_chat(CHAT, [CLOCK], "no placeholder here")
    finally:
        await backend.close()


async def opened(fake: FakeOpenAI) -> OpenAIBackend:
    return await OpenAIBackend.open(OpenAIEngineConfig(url=fake.url, model=MODEL))


async def test_a_server_is_sent_the_template_only_when_set(fake):
    backend = await opened(fake)
    try:
        await last_output(backend)
        await backend.count_chat(CHAT, [CLOCK])
        assert "tool_instructions" not in fake.chats[-1]
        assert "tool_instructions" not in fake.counts[-1]
        await last_output(backend, tool_instructions=MINE)
        await backend.count_chat(CHAT, [CLOCK], MINE)
        assert fake.chats[-1]["tool_instructions"] == MINE
        assert fake.counts[-1]["tool_instructions"] == MINE
    finally:
        await backend.close()


async def test_a_strict_server_gets_the_request_without_the_field(fake):
    fake.strict = "openai"
    backend = await opened(fake)
    try:
        out = await last_output(backend, tool_instructions=MINE)
        assert out.finished and out.text == "hello from the fake"
        assert "tool_instructions" in fake.refused[0] and "tool_instructions" not in fake.chats[-1]
        assert "tool_instructions" in backend.refused_fields
    finally:
        await backend.close()
