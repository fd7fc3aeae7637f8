"""The OpenAI backend against a fake server on the real wire protocol: the stream as the agent
reads it (tool calls structured or in content), what is sent, timeouts, retries, failures that
keep the turn, token counts and the context length."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from engine import SamplingParams
from engine.chat import ChatFormatter
from engine.tokenizer import Tokenizer
from engine.tool_parser import parse_tool_calls
from openclaw.agent.model import ModelUnavailable
from openclaw.backends import http, server_stats
from openclaw.backends.http import ServerRefused
from openclaw.backends.openai import OpenAIBackend
from openclaw.backends.stream import StreamError
from openclaw.config import OpenAIEngineConfig, Secret
from tests.fakes.openai_api import MODEL, FakeOpenAI, Reply, count_tokens, replies
from tests.helpers.llama3_tokenizer import tokenizer_folder
from tests.helpers.waiting import until

HELLO = [{"role": "user", "content": "hello there"}]
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}}


def settings(fake: FakeOpenAI, **keys) -> OpenAIEngineConfig:
    return OpenAIEngineConfig(url=fake.url, **{"model": MODEL, **keys})


async def opened(fake: FakeOpenAI, **keys) -> OpenAIBackend:
    return await OpenAIBackend.open(settings(fake, **keys))


async def answer(backend: OpenAIBackend, prompt=HELLO, params=None, **kw):
    """Every output of one call."""
    async with aclosing(backend.generate(prompt, params or SamplingParams(max_tokens=64), **kw)) as s:
        return [out async for out in s]


# ---- the stream -----------------------------------------------------------------------------


async def test_content_streams_as_it_comes_and_the_usage_gives_the_counts(fake):
    fake.reply = lambda body: Reply("The answer is forty-two.", chunk=5, usage=(17, 6))
    backend = await opened(fake)
    outs = await answer(backend)
    assert "".join(o.delta_text for o in outs) == "The answer is forty-two."
    assert len(outs) > 3 and not any(o.finished for o in outs[:-1])
    last = outs[-1]
    assert last.finished and last.finish_reason == "stop" and last.text == "The answer is forty-two."
    assert (last.prompt_tokens, last.completion_tokens) == (17, 6)
    await backend.close()


async def test_structured_tool_call_deltas_become_the_calls_the_agent_parses(fake):
    fake.reply = lambda body: Reply("Let me look.", tool_calls=[
        ("clock", {"timezone": "Europe/Paris"}), ("clock", {"timezone": "UTC"})], chunk=3)
    backend = await opened(fake)
    outs = await answer(backend, tools=[CLOCK])
    parsed = parse_tool_calls(outs[-1].text)
    assert parsed.content == "Let me look." and parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("clock", {"timezone": "Europe/Paris"}), ("clock", {"timezone": "UTC"})]
    assert outs[-1].finish_reason == "stop"  # a call ends an answer as a stop does
    # What is shown while it streams is the content, never a half call.
    assert "".join(o.delta_text for o in outs[:-1]) == "Let me look."
    await backend.close()


async def test_a_server_that_ignores_stream_gives_its_whole_answer(fake):
    fake.ignores_stream = True
    fake.reply = lambda body: Reply("Not streamed.", tool_calls=[("clock", {"timezone": "UTC"})],
                                    usage=(11, 5))
    backend = await opened(fake)
    outs = await answer(backend, tools=[CLOCK])
    last = outs[-1]
    parsed = parse_tool_calls(last.text)
    assert last.finished and parsed.content == "Not streamed."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("clock", {"timezone": "UTC"})]
    assert (last.prompt_tokens, last.completion_tokens) == (11, 5)
    await backend.close()


async def test_a_structured_call_with_broken_arguments_reaches_the_parser_as_an_error(fake):
    fake.reply = lambda body: Reply(tool_calls=[("clock", '{"timezone": "UTC"'), ("clock", "[1]")])
    backend = await opened(fake)
    parsed = parse_tool_calls((await answer(backend, tools=[CLOCK]))[-1].text)
    assert parsed.tool_calls == [] and len(parsed.errors) == 2
    assert all("arguments" in e and "clock" in e for e in parsed.errors)
    await backend.close()


@pytest.mark.parametrize("content", [
    '<tool_call>{"name": "clock", "arguments": {"timezone": "UTC"}}</tool_call>',
    '{"name": "clock", "arguments": {"timezone": "UTC"}}',  # Ollama's way with some models
])
async def test_a_call_the_server_returns_as_text_in_content_is_recovered(fake, content):
    fake.reply = lambda body: Reply(content)
    backend = await opened(fake)
    parsed = parse_tool_calls((await answer(backend, tools=[CLOCK]))[-1].text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("clock", {"timezone": "UTC"})]
    await backend.close()


async def test_the_request_carries_the_tools_the_settings_and_the_users_salt(fake):
    backend = await opened(fake, api_key=Secret("sk-test"))
    params = SamplingParams(temperature=0.2, top_p=0.9, max_tokens=50, tool_choice="auto", seed=7)
    await answer(backend, params=params, tools=[CLOCK], cache_salt="telegram:42",
                 request_id="turn-1-0")
    body = fake.chats[0]
    assert body["model"] == MODEL and body["messages"] == HELLO and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.2, 0.9, 50, 7)
    assert body["tools"] == [CLOCK] and body["tool_choice"] == "auto"
    # One user's cached prefixes are never another's, on a server shared with others too.
    assert body["user"] == body["cache_salt"] == "telegram:42"
    assert "top_k" not in body and "repetition_penalty" not in body and "priority" not in body
    headers = fake.chat_headers[0]
    assert headers["Authorization"] == "Bearer sk-test" and headers["X-Request-Id"] == "turn-1-0"
    await answer(backend, params=SamplingParams(tool_choice="none"), tools=[CLOCK])
    assert "tools" not in fake.chats[1] and "user" not in fake.chats[1]
    await backend.close()


async def test_leaving_the_stream_closes_the_request_on_the_server(fake):
    fake.reply = lambda body: Reply("word " * 200, delay=0.02)
    backend = await opened(fake)
    async with aclosing(backend.generate(HELLO, SamplingParams(max_tokens=500))) as stream:
        async for _ in stream:
            break
    await until(lambda: fake.disconnects == [0])
    assert backend.stats()["num_running"] == 0
    await backend.close()


async def test_abort_ends_the_stream_with_finish_reason_abort(fake):
    fake.reply = lambda body: Reply("word " * 200, delay=0.02)
    backend = await opened(fake)
    outs = []
    async for out in backend.generate(HELLO, SamplingParams(max_tokens=500), "r1"):
        outs.append(out)
        if len(outs) == 2:
            await backend.abort("r1")
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    await until(lambda: fake.disconnects == [0])
    await backend.close()


async def test_an_abort_while_the_request_waits_between_tries_ends_it_when_answered(fake,
                                                                                   monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", 0.3)
    fake.reply = replies(Reply(status=503), Reply("word " * 200, delay=0.02))
    backend = await opened(fake)
    call = asyncio.create_task(answer(backend, request_id="r1"))
    await until(lambda: len(fake.chats) == 1)  # refused once: waiting to try again
    await backend.abort("r1")
    outs = await asyncio.wait_for(call, 5)
    assert [o.finish_reason for o in outs] == ["abort"] and outs[-1].text == ""
    await until(lambda: fake.disconnects == [1])
    assert backend.stats()["num_running"] == 0
    await backend.close()


# ---- timeouts, retries, failures --------------------------------------------------------------


async def test_no_first_token_in_time_is_the_server_unavailable(fake):
    fake.reply = lambda body: Reply("late", first_delay=5)
    backend = await opened(fake, first_token_timeout=0.3)
    with pytest.raises(ModelUnavailable, match="no first token in 0.3 s"):
        await answer(backend)
    await until(lambda: fake.disconnects == [0])  # and the request is not left running there
    await backend.close()


async def test_a_long_answer_is_fine_but_a_silent_one_is_not(fake):
    # Longer in all than either limit, but never idle for long: fine.
    fake.reply = lambda body: Reply("x" * 40, chunk=1, first_delay=0.1, delay=0.03)
    backend = await opened(fake, first_token_timeout=0.5, idle_timeout=0.3)
    assert (await answer(backend))[-1].text == "x" * 40
    fake.reply = lambda body: Reply("x" * 40, chunk=1, silent_after=3)
    with pytest.raises(ModelUnavailable, match="sent nothing for 0.3 s in the middle"):
        await answer(backend)
    await backend.close()


async def test_5xx_and_429_are_retried_before_the_first_token(fake):
    fake.reply = replies(Reply(status=503), Reply(status=429, retry_after="0"), "third time")
    backend = await opened(fake, retries=3)
    assert (await answer(backend))[-1].text == "third time"
    assert len(fake.chats) == 3
    await backend.close()


async def test_when_the_retries_run_out_the_server_is_unavailable(fake):
    fake.reply = lambda body: Reply(status=502, error="bad gateway")
    backend = await opened(fake, retries=2)
    with pytest.raises(ModelUnavailable, match="HTTP 502: bad gateway"):
        await answer(backend)
    assert len(fake.chats) == 3
    await backend.close()


async def test_an_error_of_the_request_is_not_retried(fake):
    fake.reply = lambda body: Reply(status=400, error="This model's maximum context length is 4096")
    backend = await opened(fake)
    with pytest.raises(ServerRefused, match="HTTP 400: This model's maximum context length"):
        await answer(backend)
    assert len(fake.chats) == 1
    await backend.close()


async def test_a_refused_connection_is_retried_until_the_server_is_back(fake, monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", 0.2)
    backend = await opened(fake, retries=4)
    await fake.stop()
    call = asyncio.create_task(answer(backend))
    await asyncio.sleep(0.3)  # at least one try refused
    await fake.start()
    assert (await call)[-1].text == "hello from the fake"
    await backend.close()


async def test_a_daemon_stopping_ends_the_waits_between_tries(fake, monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", 30.0)
    stopping = asyncio.Event()
    backend = await OpenAIBackend.open(settings(fake, retries=3), stopping)
    fake.reply = lambda body: Reply(status=503, error="overloaded")
    call = asyncio.create_task(answer(backend))
    await until(lambda: len(fake.chats) == 1)
    stopping.set()
    with pytest.raises(ModelUnavailable, match="HTTP 503: overloaded .not tried again: stopping"):
        await asyncio.wait_for(call, 2)
    assert len(fake.chats) == 1
    await backend.close()


async def test_a_server_gone_mid_answer_is_unavailable(fake):
    fake.reply = lambda body: Reply("word " * 50, cut_after=3)
    backend = await opened(fake)
    with pytest.raises(ModelUnavailable, match="broke off"):
        await answer(backend)
    await backend.close()


async def test_an_error_the_server_sends_inside_the_stream_is_an_error(fake):
    fake.reply = lambda body: Reply("so far", error_after=1, error="the engine ran out of blocks")
    backend = await opened(fake)
    with pytest.raises(StreamError, match="the engine ran out of blocks"):
        await answer(backend)
    await backend.close()


async def test_a_refused_key_is_for_the_config_to_fix(fake):
    fake.api_key = "right"
    with pytest.raises(ValueError, match=r"answered HTTP 401: Incorrect API key provided: \*\*\*\.: "
                                         "check url and api_key"):
        await opened(fake, api_key=Secret("wrong"))


# ---- the model, its context, its tokens ---------------------------------------------------------


async def test_the_context_length_is_the_servers_unless_set(fake):
    fake.max_model_len = 32768
    backend = await opened(fake)
    assert backend.max_model_len == 32768
    await backend.close()
    backend = await opened(fake, context_length=8192)
    assert backend.max_model_len == 8192
    await backend.close()


async def test_a_server_that_does_not_state_the_context_length_needs_it_set(fake):
    fake.max_model_len = None  # as Ollama's /v1/models
    with pytest.raises(ValueError, match="does not state the context length.*set context_length"):
        await opened(fake)
    backend = await opened(fake, context_length=4000)
    assert backend.max_model_len == 4000
    await backend.close()


async def test_the_model_is_the_one_served_unless_named_and_a_wrong_name_is_said(fake):
    backend = await OpenAIBackend.open(OpenAIEngineConfig(url=fake.url))
    assert backend.model == MODEL
    await backend.close()
    with pytest.raises(ValueError, match=f'model "qwen" is not served by .*, which serves {MODEL}'):
        await opened(fake, model="qwen")


async def test_the_start_waits_for_a_server_not_up_yet_and_a_stop_ends_the_wait(fake):
    await fake.stop()
    opening = asyncio.create_task(OpenAIBackend.open(settings(fake)))
    await asyncio.sleep(0.3)
    assert not opening.done()
    await fake.start()
    backend = await asyncio.wait_for(opening, 10)
    assert backend.max_model_len == 4096
    await backend.close()
    await fake.stop()
    stopping = asyncio.Event()
    opening = asyncio.create_task(OpenAIBackend.open(settings(fake), stopping))
    await asyncio.sleep(0.2)
    stopping.set()
    with pytest.raises(ModelUnavailable, match="stopped after waiting"):
        await asyncio.wait_for(opening, 5)


async def test_with_model_and_context_length_set_the_start_needs_no_server(fake):
    await fake.stop()
    backend = await asyncio.wait_for(opened(fake, context_length=2048), 5)
    assert backend.max_model_len == 2048
    with pytest.raises(ModelUnavailable, match="cannot connect"):
        await answer(backend)
    await backend.close()


async def test_tokens_are_counted_by_the_servers_tokenize(fake):
    backend = await opened(fake)
    assert await backend.count_chat(HELLO, [CLOCK]) == count_tokens(HELLO, [CLOCK])
    assert backend.fixed_counts  # a tokenizer's counts: the agent may keep them per message
    assert fake.counts[0] == {"model": MODEL, "messages": HELLO, "add_generation_prompt": True,
                              "tools": [CLOCK]}
    # A message alone is the server's to count too: no local count stands in for it.
    assert backend.count_message(HELLO[-1], {"role": "system", "content": "."}) is None
    await backend.close()


async def test_without_tokenize_the_local_tokenizer_counts(fake, tmp_path):
    fake.tokenize = False
    tokenizer_folder(tmp_path)
    backend = await opened(fake, tokenizer=tmp_path)
    exact = ChatFormatter(Tokenizer.from_hf_folder(tmp_path)).encode(HELLO, tools=[CLOCK])
    assert await backend.count_chat(HELLO, [CLOCK]) == len(exact)
    assert await backend.count_chat(HELLO, [CLOCK]) == len(exact)
    assert fake.counts == []  # asked once, found missing, not asked again
    assert backend.server_count.available is False and backend.fixed_counts
    # A new message's count, by the same tokenizer without the template (engine.chat_count).
    after = {"role": "system", "content": "."}
    for message in [*HELLO, {"role": "assistant", "content": " spaced \n"}]:
        assert backend.count_message(message, after) == (
            await backend.count_chat([after, message]) - await backend.count_chat([after]))
    assert backend.local_count.messages.fast(HELLO[-1], after) is not None
    await backend.close()


async def test_without_tokenize_or_tokenizer_the_servers_usage_sets_the_estimate(fake):
    fake.tokenize = False
    backend = await opened(fake)
    first = await backend.count_chat(HELLO)
    assert first > 0  # a guess on the high side before any usage was reported
    assert not backend.fixed_counts  # it changes with the usage: never kept per message
    fake.reply = lambda body: Reply("ok", usage=(1000, 1))
    await answer(backend)
    assert await backend.count_chat(HELLO) >= 1000  # the server said this prompt cost 1000
    await backend.close()


async def test_stats_say_the_model_the_server_and_what_it_reported(fake):
    fake.reply = lambda body: Reply("four", usage=(30, 4), cached_tokens=16)
    backend = await opened(fake)
    await answer(backend)
    stats = backend.stats()
    assert (stats["model"], stats["device"]) == (MODEL, fake.url)
    assert (stats["generated_tokens"], stats["prefix_cache_queries"], stats["prefix_cache_hits"]) \
        == (4, 30, 16)
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    await backend.close()


async def test_stats_take_the_load_the_servers_metrics_state(fake, monkeypatch):
    monkeypatch.setattr(server_stats, "POLL_S", 0.05)
    fake.metrics = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="fake-model"} 3.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="fake-model"} 1.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="fake-model"} 0.25\n')
    backend = await opened(fake)
    await until(lambda: backend.stats()["kv_usage"] == 0.25)
    assert (backend.stats()["num_running"], backend.stats()["num_waiting"]) == (3, 1)
    fake.metrics = fake.metrics.replace("0.25", "0.5")
    await until(lambda: backend.stats()["kv_usage"] == 0.5)
    await backend.close()


def test_the_load_openclaw_serve_states_is_read_as_vllms():
    text = ("# TYPE openclaw_engine_running gauge\nopenclaw_engine_running 2.0\n"
            "# TYPE openclaw_engine_waiting gauge\nopenclaw_engine_waiting 5.0\n"
            "# TYPE openclaw_kv_cache_usage gauge\nopenclaw_kv_cache_usage 0.125\n")
    assert server_stats.parse(text) == {"num_running": 2, "num_waiting": 5, "kv_usage": 0.125}
