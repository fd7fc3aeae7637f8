"""Streamed chat through the official `openai` client: a tool round trip in deltas, n = 2 in one
stream, stop strings; max_completion_tokens, the penalties, top_k and min_p as the engine applies
them; and nothing of a request's content in the log."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from tests.helpers.tools import TOOLS

HELLO = [{"role": "user", "content": "Say hello."}]
LONG = {"extra_body": {"ignore_eos": True}}


def chat(client, messages=HELLO, **kw):
    return client.chat.completions.create(model="chat-model0", messages=messages, **kw)


def by_choice(chunks) -> dict[int, tuple[str, str | None]]:
    """Each choice's streamed content and finish_reason, by index."""
    out: dict[int, tuple[str, str | None]] = {}
    for chunk in chunks:
        for c in chunk.choices:
            text, finish = out.get(c.index, ("", None))
            out[c.index] = (text + (c.delta.content or ""), c.finish_reason or finish)
    return out


def test_a_streamed_tool_round_trip_calls_in_deltas_then_answers_the_tools_result(api, client):
    chunks = list(chat(client, tools=TOOLS, tool_choice="required", max_tokens=200, seed=5,
                       stream=True))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    (call,) = calls.values()
    assert call["id"].startswith("call_") and isinstance(json.loads(call["arguments"]), dict)
    messages = [*HELLO,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call["id"], "type": "function",
                     "function": {"name": call["name"], "arguments": call["arguments"]}}]},
                {"role": "tool", "tool_call_id": call["id"], "content": "the volume is 7"}]
    answer = list(chat(client, messages, tools=TOOLS, max_tokens=6, stream=True,
                       stream_options={"include_usage": True}, **LONG))
    assert by_choice(answer)[0][1] == "length" and by_choice(answer)[0][0]
    # The model read the call and its result: the prompt is the round trip's, token for token.
    tokens = httpx.post(api.url + "/tokenize", json={"messages": messages, "tools": TOOLS}).json()
    assert answer[-1].usage.prompt_tokens == tokens["count"]
    text = httpx.post(api.url + "/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert f'"name": "{call["name"]}"' in text and "the volume is 7" in text


def test_n_2_streamed_gives_both_choices_each_to_its_finish(client):
    whole = chat(client, n=2, max_tokens=8, seed=11, **LONG)
    streamed = by_choice(chat(client, n=2, max_tokens=8, seed=11, stream=True, **LONG))
    assert sorted(streamed) == [0, 1]
    for i, choice in enumerate(whole.choices):
        assert streamed[i] == (choice.message.content, "length")
    assert streamed[0][0] != streamed[1][0]  # seed + index: two answers


def test_a_streamed_stop_string_is_not_emitted_and_finishes_with_stop(client):
    text = chat(client, temperature=0, max_tokens=16, **LONG).choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 3]
    chunks = list(chat(client, temperature=0, max_tokens=16, stop=[stop], stream=True))
    content, finish = by_choice(chunks)[0]
    assert finish == "stop" and content == text[:text.index(stop)]
    assert stop not in content


def test_max_completion_tokens_is_honoured_and_wins_over_max_tokens(client):
    reply = chat(client, max_completion_tokens=5, **LONG)
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"
    both = chat(client, max_completion_tokens=3, max_tokens=9, **LONG)
    assert both.usage.completion_tokens == 3
    chunks = list(chat(client, max_completion_tokens=4, stream=True,
                       stream_options={"include_usage": True}, **LONG))
    assert chunks[-1].usage.completion_tokens == 4


def test_top_k_1_and_min_p_1_sample_the_greedy_answer(client):
    greedy = chat(client, temperature=0, max_tokens=12, **LONG).choices[0].message.content
    hot = {"temperature": 1.5, "max_tokens": 12, **LONG}
    free = {chat(client, seed=s, **hot).choices[0].message.content for s in range(3)}
    assert free != {greedy}  # sampled freely, the answers differ from the greedy one
    for s in range(3):
        assert chat(client, seed=s, extra_body={"top_k": 1, "ignore_eos": True},
                    **{k: v for k, v in hot.items() if k != "extra_body"}
                    ).choices[0].message.content == greedy
        assert chat(client, seed=s, extra_body={"min_p": 1.0, "ignore_eos": True},
                    **{k: v for k, v in hot.items() if k != "extra_body"}
                    ).choices[0].message.content == greedy


def test_presence_and_frequency_penalties_change_the_answer_and_are_range_checked(api, client):
    def tokens(**kw) -> list[int]:
        reply = chat(client, temperature=0, max_tokens=40, logprobs=True, **LONG, **kw)
        return [t.token for t in reply.choices[0].logprobs.content]

    plain = tokens()
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalized = tokens(**penalty)
        assert penalized != plain
        assert len(set(penalized)) >= len(set(plain))  # fewer repeats, not more
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, presence_penalty=2.5)
    assert refused.value.body["param"] == "presence_penalty"


def test_nothing_of_a_requests_content_reaches_the_log(api, client, caplog):
    secret = "zanzibar-4417 my card number"
    caplog.set_level(logging.DEBUG)
    messages = [{"role": "user", "content": f"Remember {secret}."}]
    chat(client, messages, max_tokens=3)
    list(chat(client, messages, max_tokens=3, stream=True))
    chat(client, messages, tools=TOOLS, tool_choice="required", max_tokens=60, seed=1)
    with pytest.raises(openai.BadRequestError):
        chat(client, messages, temperature=f"{secret}")
    httpx.post(api.url + "/v1/completions", json={"prompt": secret, "max_tokens": 2})
    httpx.post(api.url + "/tokenize", json={"prompt": secret})
    assert caplog.records  # the log was listening
    assert "zanzibar" not in caplog.text and "4417" not in caplog.text
