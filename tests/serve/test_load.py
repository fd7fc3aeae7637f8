"""Many clients at once: they batch together in the engine; one that leaves mid-stream frees its
blocks; past the queue's bound the server answers 503 rather than queueing without end."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.serve_thread import ServerThread

HELLO = [{"role": "user", "content": "Say hello."}]
LONG = {"max_tokens": 400, "extra_body": {"ignore_eos": True}}


SERVER = {"max_waiting": 0}  # at most max_num_seqs (32) sequences in flight

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


def scrape(api) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed as Prometheus parses it, by name and labels."""
    response = httpx.get(api.url + "/metrics")
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def test_metrics_have_the_engines_series_under_the_daemons_names_and_the_apis_own(api, llm):
    before = scrape(api)
    requests = ("openclaw_serve_requests_total",
                (("endpoint", "/v1/chat/completions"), ("status", "200")))
    api.client().chat.completions.create(model="chat-model0", messages=HELLO, max_tokens=2)
    httpx.post(api.url + "/v1/chat/completions", json={"messages": HELLO, "n": 0})
    httpx.get(api.url + "/no/such/path")
    values = scrape(api)
    stats = llm.stats()
    # The engine's, as the daemon's /metrics names them (openclaw.metrics.EngineCollector).
    assert values[("openclaw_engine_running", ())] == 0
    assert values[("openclaw_engine_kv_blocks", ())] == llm.engine.block_manager.num_blocks
    assert values[("openclaw_generated_tokens", ())] == stats["generated_tokens"] > 0
    assert values[("openclaw_engine_requests_finished_total", ())] == stats["num_requests_finished"]
    ttft = "openclaw_engine_time_to_first_token_seconds"
    assert values[(f"{ttft}_count", ())] == stats["ttft_seconds"]["count"] > 0
    assert values[(f"{ttft}_bucket", (("le", "+Inf"),))] == stats["ttft_seconds"]["count"]
    # The API's own: requests by endpoint and status (a path it does not have is "other"), the
    # ones in flight (this scrape), the queue's bound.
    assert values[requests] == before.get(requests, 0) + 1
    bad = ("openclaw_serve_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "400")))
    assert values[bad] == before.get(bad, 0) + 1
    assert values[("openclaw_serve_requests_total", (("endpoint", "other"), ("status", "404")))] >= 1
    assert values[("openclaw_serve_requests_in_flight", ())] == 1
    assert values[("openclaw_serve_sequences_in_flight", ())] == 0
    assert values[("openclaw_serve_sequences_max", ())] == 32
    assert not any(name.startswith("openclaw_engine_num_") for name, _ in values)  # round 1's


def test_a_client_that_leaves_mid_stream_counts_as_499(api):
    left = ("openclaw_serve_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "499")))
    before = scrape(api).get(left, 0)
    with httpx.stream("POST", api.url + "/v1/chat/completions", json={
            "messages": HELLO, "stream": True, "max_tokens": 900, "ignore_eos": True}) as response:
        next(response.iter_lines())
    api.wait_idle(timeout=10)
    deadline = time.monotonic() + 10  # the handler ends once the server saw the hang-up
    while scrape(api).get(left, 0) != before + 1:
        assert time.monotonic() < deadline, "the request that left was not counted"
        time.sleep(0.01)


def half_sent(url: str) -> socket.socket:
    """A connection that sends part of a request head and then nothing: a flood's unit."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
    return sock


def test_a_flood_of_half_sent_connections_past_the_cap_leaves_real_clients_served(llm):
    server = ServerThread(llm, max_connections=8)
    client = server.client()
    try:
        streams = [client.chat.completions.create(model="chat-model0", messages=HELLO, stream=True,
                                                  max_tokens=40, extra_body={"ignore_eos": True})
                   for _ in range(4)]
        first = [next(iter(s)) for s in streams]  # each holds a connection being answered
        flood = []
        for _ in range(300):
            flood.append(half_sent(server.url))
            assert server.server.connections <= 16  # twice the cap at most, whatever comes
            # Paced, so that the server's thread (this process's GIL) accepts each in turn: past
            # the kernel's accept queue a connect waits out a SYN retry (1 s), which tests nothing.
            time.sleep(0.002)
        reply = client.chat.completions.create(model="chat-model0", messages=HELLO, max_tokens=3,
                                               extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 3  # a new client got in during the flood
        for stream, chunk in zip(streams, first, strict=True):  # and the streams went on
            chunks = [chunk, *stream]
            assert chunks[-1].choices[0].finish_reason == "length"
        dropped = scrape(server)[("openclaw_serve_connections_dropped_total", ())]
        assert dropped >= 300 - 16
        for sock in flood:
            sock.close()
    finally:
        server.close()
