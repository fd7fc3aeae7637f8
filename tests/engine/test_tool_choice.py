"""Constrained tool calls through the real engine: a random-weight model on SmolLM2's vocabulary
(garbage in every row, the harshest test a grammar can get) and the embedded SmolLM2 itself."""

from __future__ import annotations

import pytest

from engine import LLM, AsyncLLM, SamplingParams
from engine.constrained.grammar import MAX_WS
from engine.engine_core import LLMEngine
from engine.llm import offered_tools
from engine.tool_parser import parse_tool_calls
from tests.helpers.engine_steps import run_requests
from tests.helpers.tools import TOOLS

NAMES = {t["function"]["name"] for t in TOOLS}
CHAT = [{"role": "user", "content": "What is the weather like?"}]


@pytest.fixture(scope="module")
def random_engine(random_folder) -> LLMEngine:
    return LLM(random_folder, kv_cache_gib=0.05, max_model_len=1024).engine


def run(engine: LLMEngine, params: list[SamplingParams], tools=TOOLS, prompt=None):
    return run_requests(engine, prompt or engine.encode_chat(CHAT, tools), params, tools)


def test_required_call_from_a_random_model_always_parses(random_engine):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=300, tool_choice="required")
              for s in range(24)]
    for out in run(random_engine, params):
        parsed = parse_tool_calls(out.text)
        # At most a short whitespace run before the call (SentencePiece models start with "▁<").
        lead = len(out.text) - len(out.text.lstrip(" \t\r\n"))
        assert out.finish_reason == "stop" and lead <= MAX_WS, out.text
        assert out.text[lead:].startswith("<tool_call>"), out.text
        assert parsed.errors == [] and parsed.content == "", out.text
        assert len(parsed.tool_calls) == 1 and out.text.count("<tool_call>") == 1, out.text
        assert parsed.tool_calls[0].name in NAMES and isinstance(parsed.tool_calls[0].arguments,
                                                                  dict)
    assert random_engine.stats()["num_running"] == 0


def test_named_tool_choice_forces_that_tool(random_engine):
    named = {"type": "function", "function": {"name": "set_volume"}}
    # One params object for all rows: each request still gets its own grammar state.
    params = [SamplingParams(temperature=1.0, max_tokens=300, tool_choice=named)] * 6
    for out in run(random_engine, params):
        parsed = parse_tool_calls(out.text)
        assert parsed.errors == [] and [c.name for c in parsed.tool_calls] == ["set_volume"]
        assert set(parsed.tool_calls[0].arguments) <= {"level"}


def test_preempted_constrained_requests_keep_their_grammar_state(random_folder, random_engine):
    # A pool of 48 blocks of 16 (one request's prompt and output fit) for 6 requests of about 420
    # tokens: preemption is certain.
    small = LLM(random_folder, kv_cache_gib=48 * 16 * 2 * 2 * 2 * 16 * 4 / 2**30,
                max_model_len=1024, max_num_batched_tokens=256).engine
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=300, tool_choice="required")
              for s in range(6)]
    outs = run(small, params)
    assert small.stats()["num_preemptions"] > 0
    expected = run(random_engine, params)
    assert [o.text for o in outs] == [o.text for o in expected]


def test_tool_choice_none_changes_nothing(random_engine):
    none = SamplingParams(temperature=0.0, max_tokens=40, tool_choice="none")
    assert offered_tools(TOOLS, none) is None  # chat prompts do not show the tools
    prompt = random_engine.encode_chat(CHAT)
    plain = run(random_engine, [SamplingParams(temperature=0.0, max_tokens=40)], tools=None,
                prompt=prompt)
    random_engine.add_request("none", prompt, none, tools=TOOLS)
    assert random_engine._requests["none"].seq.constraint is None
    random_engine.abort_request("none")
    assert run(random_engine, [none], prompt=prompt)[0].token_ids == plain[0].token_ids


def test_required_without_tools_is_refused_with_the_field_named(random_engine):
    with pytest.raises(ValueError, match="tool_choice='required' needs tools"):
        random_engine.add_request("bad", [1, 2, 3], SamplingParams(tool_choice="required"))
    assert "bad" not in random_engine._requests


async def test_async_chat_carries_tools_and_tool_choice_to_the_engine(random_folder):
    engine = AsyncLLM(random_folder, kv_cache_gib=0.05, max_model_len=1024)
    try:
        named = {"type": "function", "function": {"name": "get_weather"}}
        reply = await engine.chat(CHAT, SamplingParams(temperature=1.0, seed=3, max_tokens=300,
                                                       tool_choice=named), tools=TOOLS)
        assert reply.errors == [] and [c.name for c in reply.tool_calls] == ["get_weather"]
        missing = {"type": "function", "function": {"name": "send_email"}}
        with pytest.raises(ValueError, match="send_email"):
            await engine.chat(CHAT, SamplingParams(tool_choice=missing), tools=TOOLS)
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def smollm(embedded_llm):
    return embedded_llm


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_smollm_named_tool_choice_gives_a_parseable_call_to_that_tool(smollm):
    email = {"type": "function", "function": {"name": "send_email", "parameters": {
        "type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}}}}
    named = {"type": "function", "function": {"name": "send_email"}}
    reply = smollm.chat([{"role": "user", "content": "Tell bob@example.com that I am late."}],
                        SamplingParams(temperature=0.0, max_tokens=80, tool_choice=named),
                        tools=[*WEATHER, email])
    assert reply.errors == [] and reply.output.finish_reason == "stop", reply.output.text
    assert [c.name for c in reply.tool_calls] == ["send_email"]
    assert set(reply.tool_calls[0].arguments) <= {"to", "body"}


def test_smollm_auto_opens_calls_mid_text_and_every_call_parses(smollm):
    # Two earlier turns show the model what a call looks like after a sentence.
    def turn(city: str, answer: str) -> list[dict]:
        call = {"type": "function", "function": {"name": "get_weather",
                                                 "arguments": {"city": city}}}
        return [{"role": "user", "content": f"Weather in {city}?"},
                {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
                {"role": "tool", "content": answer},
                {"role": "assistant", "content": f"It is {answer} in {city}."}]

    # The history calls get_weather, which this request no longer offers: left alone, the model
    # copies the old name; constrained, every call it opens must name weather_now.
    chat = [*turn("Rome", "sunny, 25C"), *turn("Oslo", "rain, 8C"),
            {"role": "user", "content": "Weather in Paris?"}]
    renamed = [{"type": "function", "function": {**WEATHER[0]["function"], "name": "weather_now"}}]
    prompt = smollm.engine.encode_chat(chat, renamed)
    outs = smollm.generate([prompt] * 8, [SamplingParams(temperature=1.0, seed=s, max_tokens=60)
                                          for s in range(8)], tools=renamed)
    opened = [o for o in outs if "<tool_call>" in o.text]
    assert any(not o.text.startswith("<tool_call>") for o in opened), [o.text for o in outs]
    for out in opened:
        parsed = parse_tool_calls(out.text)
        assert parsed.errors == [] and parsed.tool_calls, out.text
        assert all(c.name == "weather_now" for c in parsed.tool_calls), out.text
