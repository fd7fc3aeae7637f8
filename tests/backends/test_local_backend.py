"""The engine in this process behind the agent's interface: counts with the engine's tokenizer,
outputs in the agent's terms, and leaving a stream aborts its request in the engine."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import pytest_asyncio

from engine import SamplingParams
from engine.config import EngineConfig
from openclaw.backends import open_backend
from openclaw.backends.local import LocalBackend
from tests.helpers.waiting import until

CHAT = [{"role": "user", "content": "Say hello."}]

# One load of the embedded model for the module: its tests run on one event loop, the engine's.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend():
    # No model named: the embedded one.
    local = await open_backend(EngineConfig(device="cpu", kv_cache_gib=0.02, max_model_len=512))
    assert isinstance(local, LocalBackend)
    yield local
    await local.close()


async def test_the_local_engine_counts_and_streams_in_the_agents_terms(backend):
    assert backend.max_model_len == 512
    assert await backend.count_chat(CHAT) == len(backend.llm.encode_chat(CHAT))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = [o async for o in backend.generate(CHAT, params, cache_salt="terminal:local")]
    last = outs[-1]
    assert last.finished and last.finish_reason == "length" and last.completion_tokens == 6
    assert last.prompt_tokens == await backend.count_chat(CHAT)
    assert "".join(o.delta_text for o in outs) == last.text
    assert backend.stats()["generated_tokens"] >= 6


async def test_the_local_engine_counts_a_new_message_as_its_share_of_the_whole_count(backend):
    after = {"role": "system", "content": "."}
    for message in [*CHAT, {"role": "assistant", "content": " hi\n"},
                    {"role": "tool", "tool_call_id": "c1", "content": "<|im_end|> 12:00"}]:
        assert backend.count_message(message, after) == (
            await backend.count_chat([after, message]) - await backend.count_chat([after]))
    # SmolLM2's template writes each message between special tokens: counted without it.
    assert backend.llm.engine.message_counter.fast(CHAT[0], after) is not None


async def test_leaving_the_stream_aborts_the_engines_request(backend):
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    async with aclosing(backend.generate(CHAT, params, "r1")) as stream:
        async for _ in stream:
            break
    await until(lambda: backend.stats()["num_running"] == 0)
    assert backend.stats()["num_waiting"] == 0
