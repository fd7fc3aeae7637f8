"""Many clients at once: they batch together in the engine; one that leaves mid-stream frees its
blocks; past the queue's bound the server answers 503 rather than queueing without end."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.serve_thread import ServerThread

HELLO = [{"role": "user", "content": "Say hello."}]
LONG = {"max_tokens": 400, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def api(llm):
    server = ServerThread(llm, max_waiting=0)  # at most max_num_seqs (32) sequences in flight
    yield server
    server.close()


def test_sixteen_concurrent_streaming_clients_are_batched_together(api, llm):
    peak = 0

    async def main():
        nonlocal peak
        client = api.async_client()

        async def one(i: int) -> tuple[str, int]:
            stream = await client.chat.completions.create(
                model="chat-model0", messages=[{"role": "user", "content": f"Client {i} here."}],
                max_tokens=24, stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True})
            text, usage = "", None
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                usage = chunk.usage or usage
            return text, usage.completion_tokens

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, llm.stats()["num_running"])
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch())
        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            watcher.cancel()
            await client.close()

    results = asyncio.run(main())
    assert [tokens for _, tokens in results] == [24] * 16 and all(text for text, _ in results)
    assert peak > 1, "the requests ran one at a time"
    api.wait_idle()


def test_a_client_that_leaves_mid_stream_aborts_its_request_and_frees_its_blocks(api, llm):
    generated = llm.stats()["generated_tokens"]
    with httpx.stream("POST", api.url + "/v1/chat/completions", json={
            "messages": HELLO, "stream": True, "max_tokens": 900, "ignore_eos": True}) as response:
        events = response.iter_lines()
        for _ in range(6):  # the role chunk, then some content
            next(events)
        assert llm.stats()["num_running"] == 1
    api.wait_idle(timeout=10)  # the engine stopped it: nothing runs, every block is free again
    assert llm.stats()["generated_tokens"] - generated < 900


def test_a_client_that_gives_up_on_a_whole_answer_aborts_its_request_too(api, llm):
    generated = llm.stats()["generated_tokens"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(api.url + "/v1/chat/completions", timeout=0.5, json={
            "messages": HELLO, "max_tokens": 900, "ignore_eos": True})
    api.wait_idle(timeout=10)
    assert llm.stats()["generated_tokens"] - generated < 900


def test_past_the_queue_bound_a_request_gets_503_with_retry_after(api):
    client = api.client()

    def hold(n: int):
        stream = client.chat.completions.create(model="chat-model0", messages=HELLO, n=n,
                                                stream=True, **LONG)
        next(iter(stream))  # admitted and running
        return stream

    held = [hold(16), hold(16)]  # 32 sequences: the bound
    try:
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model="chat-model0", messages=HELLO, max_tokens=2)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "1"
        error = refused.value.body
        assert error["code"] == "queue_full" and "32" in error["message"]
    finally:
        for stream in held:
            stream.close()
    api.wait_idle()
    assert client.chat.completions.create(model="chat-model0", messages=HELLO, max_tokens=2)


def test_metrics_show_the_engines_counters_as_prometheus_text(api, llm):
    api.client().chat.completions.create(model="chat-model0", messages=HELLO, max_tokens=2)
    text = httpx.get(api.url + "/metrics").text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["openclaw_engine_num_running"] == 0
    assert values["openclaw_engine_generated_tokens"] == llm.stats()["generated_tokens"] > 0
    assert values["openclaw_engine_kv_blocks"] == llm.engine.block_manager.num_blocks
    assert values["openclaw_serve_sequences_max"] == 32
