"""POST /v1/chat/completions through the official `openai` client: streaming, usage, stop strings,
seeds, n > 1 on the prefix cache, per-tenant caches, and tool calls with every tool_choice."""

from __future__ import annotations

import json

import httpx

from tests.helpers.tools import TOOLS

NAMES = {t["function"]["name"] for t in TOOLS}
HELLO = [{"role": "user", "content": "Say hello."}]
# Long enough to fill several KV blocks of 16 tokens: what the prefix cache shares.
LONG = [{"role": "system", "content": "You are a careful assistant who answers briefly. " * 6},
        {"role": "user", "content": "Tell me about the sea."}]


def chat(client, messages=HELLO, **kw):
    return client.chat.completions.create(model="chat-model0", messages=messages, **kw)


def count(api, messages, tools=None) -> int:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    return httpx.post(api.url + "/tokenize", json=body).json()["count"]


def test_a_streamed_answer_is_the_whole_answer_in_deltas_ending_with_done(api, client):
    whole = chat(client, temperature=0, max_tokens=12)
    chunks = list(chat(client, temperature=0, max_tokens=12, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks][-1] == whole.choices[0].finish_reason
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    raw = httpx.post(api.url + "/v1/chat/completions", json={
        "messages": HELLO, "max_tokens": 3, "stream": True}).text
    events = [line for line in raw.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"


def test_include_usage_adds_a_last_chunk_with_no_choices_and_the_counts(api, client):
    chunks = list(chat(client, max_tokens=7, stream=True, stream_options={"include_usage": True},
                       extra_body={"ignore_eos": True}))
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.prompt_tokens == count(api, HELLO)
    assert last.usage.completion_tokens == 7 and last.usage.total_tokens == last.usage.prompt_tokens + 7


def test_a_stop_string_ends_the_answer_before_it(client):
    text = chat(client, temperature=0, max_tokens=16, extra_body={"ignore_eos": True}
                ).choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = chat(client, temperature=0, max_tokens=16, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[:text.index(stop)]
    assert cut.choices[0].stop_reason == stop


def test_the_same_seed_gives_the_same_answer(client):
    answers = [chat(client, temperature=1.0, seed=s, max_tokens=12).choices[0].message.content
               for s in (7, 7, 8)]
    assert answers[0] == answers[1] and answers[0] != answers[2]


def test_n_2_answers_twice_and_the_second_choice_reads_the_prompt_from_the_prefix_cache(llm, client):
    before = llm.stats()["prefix_cache_hits"]
    reply = chat(client, LONG, n=2, max_tokens=8, seed=3,
                 extra_body={"cache_salt": "n2-test", "ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.content != reply.choices[1].message.content
    cached = reply.usage.prompt_tokens_details.cached_tokens
    full_blocks = reply.usage.prompt_tokens // 16 * 16
    # The first choice computed the prompt (no one had this salt); the second found it cached.
    assert cached >= full_blocks - 16 > 0
    assert llm.stats()["prefix_cache_hits"] - before == cached
    assert reply.usage.completion_tokens == 16  # both choices; the prompt counted once


def test_cache_salt_and_user_keep_each_tenants_prefix_cache_apart(client):
    def cached(**extra) -> int:
        reply = chat(client, LONG, max_tokens=2, extra_body=extra) if "user" not in extra else \
            chat(client, LONG, max_tokens=2, user=extra["user"])
        return reply.usage.prompt_tokens_details.cached_tokens

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-a") > 0
    assert cached(cache_salt="tenant-b") == 0  # the same prompt, another tenant: computed anew
    assert cached(user="alice") == 0  # without a salt, the user's id keeps them apart
    assert cached(user="alice") > 0


def test_auto_lets_the_model_answer_in_text_with_the_tools_in_its_prompt(api, client):
    reply = chat(client, tools=TOOLS, max_tokens=10, temperature=0)
    assert reply.usage.prompt_tokens == count(api, HELLO, TOOLS) > count(api, HELLO)
    assert reply.choices[0].message.tool_calls is None  # a random model never opens a call
    assert reply.choices[0].finish_reason == "length"


def test_required_makes_one_valid_call_to_one_of_the_tools(client):
    for seed in range(3):
        reply = chat(client, tools=TOOLS, tool_choice="required", max_tokens=200, seed=seed)
        (call,) = reply.choices[0].message.tool_calls
        assert call.type == "function" and call.function.name in NAMES
        assert isinstance(json.loads(call.function.arguments), dict)
        assert call.id.startswith("call_") and reply.choices[0].finish_reason == "tool_calls"
        assert reply.choices[0].message.content is None


def test_parallel_tool_calls_false_is_enforced_by_the_engines_grammar(llm, client):
    # ignore_eos: no end of turn, so text follows the call, where a second call could open.
    for choice in ("required", "auto"):
        reply = chat(client, tools=TOOLS, tool_choice=choice, max_tokens=120, seed=3,
                     parallel_tool_calls=False, extra_body={"ignore_eos": True})
        assert len(reply.choices[0].message.tool_calls or []) <= 1
        # The grammar the engine built for it allows one call (the latest of its cache).
        *_, (_, mode, _, single) = llm.engine.tool_constraints._masks
        assert (mode, single) == (choice, True)
    reply = chat(client, tools=TOOLS, tool_choice="required", max_tokens=200, seed=3)
    *_, (_, mode, _, single) = llm.engine.tool_constraints._masks
    assert (mode, single) == ("required", False) and len(reply.choices[0].message.tool_calls) == 1


def test_a_named_tool_choice_calls_that_tool(client):
    reply = chat(client, tools=TOOLS, max_tokens=200, seed=1,
                 tool_choice={"type": "function", "function": {"name": "set_volume"}})
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["set_volume"]


def test_none_shows_the_model_no_tools_and_makes_no_call(api, client):
    reply = chat(client, tools=TOOLS, tool_choice="none", max_tokens=10)
    assert reply.usage.prompt_tokens == count(api, HELLO)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content


def test_a_streamed_call_comes_as_a_tool_call_delta_then_finish_reason_tool_calls(client):
    chunks = list(chat(client, tools=TOOLS, tool_choice="required", max_tokens=200, seed=2,
                       stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.index for d in deltas] == [0]
    assert deltas[0].function.name in NAMES and deltas[0].id.startswith("call_")
    assert isinstance(json.loads(deltas[0].function.arguments), dict)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)


def test_a_tool_round_trip_renders_the_call_and_its_result_into_the_prompt(api, client):
    first = chat(client, tools=TOOLS, tool_choice="required", max_tokens=200, seed=0)
    call = first.choices[0].message.tool_calls[0]
    messages = [*HELLO, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "the volume is 7"}]
    reply = chat(client, messages, tools=TOOLS, max_tokens=5)
    assert reply.usage.prompt_tokens == count(api, messages, TOOLS)
    ids = httpx.post(api.url + "/tokenize", json={"messages": messages, "tools": TOOLS}).json()
    text = httpx.post(api.url + "/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
    assert f'<tool_call>{{"name": "{call.function.name}", "arguments": ' in text
    assert "<tool_response>\nthe volume is 7\n</tool_response>" in text
