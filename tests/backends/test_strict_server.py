"""A strict server (OpenAI's own API, FastAPI servers that forbid extra fields) refuses a field it
does not know, where vLLM and ours take it: the backend sends the request again without it, once,
and does not send it to that server again, saying so once in the log."""

from __future__ import annotations

import logging
from contextlib import aclosing

import pytest

from engine import SamplingParams
from openclaw.backends import optional_fields
from openclaw.backends.http import ServerRefused
from openclaw.backends.openai import OpenAIBackend
from openclaw.config import OpenAIEngineConfig
from tests.fakes.openai_api import MODEL, FakeOpenAI, Reply

HELLO = [{"role": "user", "content": "hello there"}]


async def opened(fake: FakeOpenAI) -> OpenAIBackend:
    return await OpenAIBackend.open(OpenAIEngineConfig(url=fake.url, model=MODEL))


async def answer(backend: OpenAIBackend, params: SamplingParams | None = None) -> str:
    stream = backend.generate(HELLO, params or SamplingParams(max_tokens=16), cache_salt="tg:42")
    async with aclosing(stream) as outs:
        return [out async for out in outs][-1].text


def said(caplog, field: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and f"refuses the request field {field}" in r.getMessage()]


@pytest.mark.parametrize(("style", "refusals"), [("openai", 1), ("param", 2), ("fastapi", 1)])
async def test_fields_a_strict_server_refuses_are_left_out_once_and_for_good(fake, caplog, style,
                                                                           refusals):
    fake.strict = style
    backend = await opened(fake)
    caplog.set_level(logging.WARNING, "openclaw.backends.openai")
    assert await answer(backend, SamplingParams(max_tokens=16, top_k=20)) == "hello from the fake"
    # Refused for cache_salt and top_k: all at once where the server lists them all, else one
    # at a time; then taken without them.
    assert len(fake.refused) == refusals and {"cache_salt", "top_k"} <= fake.refused[0].keys()
    [taken] = fake.chats
    assert "cache_salt" not in taken and "top_k" not in taken
    assert taken["user"] == "tg:42" and taken["max_tokens"] == 16  # what it takes is still sent
    assert backend.refused_fields == {"cache_salt", "top_k"}
    # Not sent again: the next requests go through at once, and the log said it once.
    assert await answer(backend, SamplingParams(max_tokens=16, top_k=20)) == "hello from the fake"
    assert await answer(backend) == "hello from the fake"
    assert len(fake.refused) == refusals and len(fake.chats) == 3
    assert all("cache_salt" not in c for c in fake.chats)
    [line] = said(caplog, "cache_salt")
    assert "prefixes" in line  # what doing without it costs
    assert len(said(caplog, "top_k")) == 1
    await backend.close()


async def test_max_tokens_refused_for_max_completion_tokens_is_sent_under_that_name(fake):
    fake.unsupported = {"max_tokens"}  # as OpenAI's reasoning models answer
    backend = await opened(fake)
    assert await answer(backend, SamplingParams(max_tokens=33)) == "hello from the fake"
    assert await answer(backend, SamplingParams(max_tokens=34)) == "hello from the fake"
    assert len(fake.refused) == 1
    assert [(c.get("max_tokens"), c["max_completion_tokens"]) for c in fake.chats] == [
        (None, 33), (None, 34)]
    await backend.close()


async def test_a_server_refusing_stream_options_is_read_without_its_usage(fake):
    fake.unsupported = {"stream_options"}  # as Azure's older API versions answer
    fake.reply = lambda body: Reply("four words of answer", chunk=5)
    backend = await opened(fake)
    async with aclosing(backend.generate(HELLO, SamplingParams(max_tokens=16))) as stream:
        last = [out async for out in stream][-1]
    assert last.text == "four words of answer" and last.completion_tokens == 4  # chunks counted
    assert last.prompt_tokens > 0  # estimated
    assert len(fake.refused) == 1 and "stream_options" not in fake.chats[0]
    await backend.close()


async def test_a_field_quoted_in_a_refusal_of_something_else_is_still_sent(fake):
    fake.reply = lambda body: Reply(status=400, error="the 'user' message is too long")
    backend = await opened(fake)
    with pytest.raises(ServerRefused, match="the 'user' message is too long"):
        await answer(backend)
    # Tried once without it (the message quotes it), refused all the same: not the field's fault.
    assert len(fake.chats) == 2 and "user" not in fake.chats[1]
    assert backend.refused_fields == set()
    fake.reply = lambda body: "fine"
    assert await answer(backend) == "fine"
    assert fake.chats[-1]["user"] == "tg:42" and fake.chats[-1]["cache_salt"] == "tg:42"
    await backend.close()


@pytest.mark.parametrize(("status", "message", "param", "expected"), [
    (400, "Unrecognized request arguments supplied: cache_salt, top_k", None, ["cache_salt", "top_k"]),
    (400, "Unknown parameter: 'cache_salt'.", "cache_salt", ["cache_salt"]),
    (400, "Invalid JSON payload received. Unknown name \"cache_salt\": Cannot find field.", None,
     ["cache_salt"]),
    (400, "property 'top_k' is unsupported", None, ["top_k"]),
    (422, '{"detail": [{"type": "extra_forbidden", "loc": ["body", "user"]}]}', None, ["user"]),
    (400, "the user message is too long", None, []),  # a word, not a field named
    (400, "Unknown parameter: 'seed'.", "seed", []),  # not one a request can do without
    (400, "Unknown parameter: 'foo'.", "foo", []),  # not one we sent
    (404, "Unknown parameter: 'cache_salt'.", "cache_salt", []),  # not a refused request body
])
def test_what_a_refusal_names(status, message, param, expected):
    body = {"model": "m", "messages": HELLO, "user": "u", "cache_salt": "u", "top_k": 5, "seed": 1}
    assert optional_fields.named(ServerRefused(status, message, param), body) == expected
