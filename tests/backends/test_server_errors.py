"""A server's error, as it reaches the log and the user: never the request it echoes (a 422 body
holds the user's messages as `input`), one line, a couple of hundred characters at most."""

from __future__ import annotations

import logging
from contextlib import aclosing

import pytest

from engine import SamplingParams
from openclaw.agent.loop import APOLOGY
from openclaw.backends.http import ServerRefused
from openclaw.backends.openai import OpenAIBackend
from openclaw.backends.stream import StreamError
from openclaw.config import OpenAIEngineConfig
from tests.fakes.openai_api import MODEL, Reply, replies
from tests.helpers.daemon import say, started

from .test_daemon_on_a_server import on

DIARY = "my bank password is hunter2 and my diary says"


def validation_error(secret: str, *fields: str) -> dict:
    """FastAPI's 422 for a request it cannot read (and for `fields` it does not know), echoing
    what it read as `input`."""
    return {"detail": [
        {"type": "string_type", "loc": ["body", "messages", 1, "content"],
         "msg": "Input should be a valid string", "input": {"text": secret * 20}},
        *({"type": "extra_forbidden", "loc": ["body", name],
           "msg": "Extra inputs are not permitted", "input": "terminal:local"} for name in fields)],
        "body": {"messages": [{"role": "user", "content": secret}]}}


async def refusal(fake, reply: Reply) -> ServerRefused:
    fake.reply = lambda body: reply
    backend = await OpenAIBackend.open(OpenAIEngineConfig(url=fake.url, model=MODEL))
    try:
        with pytest.raises(ServerRefused) as raised:
            stream = backend.generate([{"role": "user", "content": DIARY}],
                                      SamplingParams(max_tokens=8))
            async with aclosing(stream) as outs:
                [_ async for _ in outs]
    finally:
        await backend.close()
    return raised.value


async def test_a_422_drops_the_input_it_echoes_and_keeps_what_was_wrong(fake):
    exc = await refusal(fake, Reply(status=422, error_body=validation_error(DIARY, "cache_salt")))
    assert exc.status == 422
    assert "hunter2" not in str(exc) and "terminal:local" not in str(exc)
    assert "'messages.1.content': Input should be a valid string" in str(exc)
    assert len(str(exc)) <= 220 and "\n" not in str(exc)


async def test_a_long_error_message_is_one_short_line(fake):
    message = "Invalid prompt:\n" + "\n".join(f"line {i} of what you sent" for i in range(100))
    exc = await refusal(fake, Reply(status=400, error=message))
    assert "\n" not in str(exc) and len(str(exc)) <= 220
    assert str(exc).startswith("HTTP 400: Invalid prompt: line 0 of what you sent line 1")


async def test_an_error_in_the_stream_is_one_short_line_too(fake):
    fake.reply = lambda body: Reply("so far", error_after=1, error="bad token in:\n" + DIARY * 30)
    backend = await OpenAIBackend.open(OpenAIEngineConfig(url=fake.url, model=MODEL))
    try:
        with pytest.raises(StreamError) as raised:
            async with aclosing(backend.generate([{"role": "user", "content": "hi"}])) as outs:
                [_ async for _ in outs]
    finally:
        await backend.close()
    assert "\n" not in str(raised.value) and len(str(raised.value)) <= 200


async def test_the_daemon_logs_no_echoed_message_and_the_user_gets_the_apology(
        tmp_path, fake, caplog):
    fake.reply = replies(Reply(status=422, error_body=validation_error(DIARY)), "later")
    daemon, conn = await started(tmp_path, None, on(fake))
    caplog.set_level(logging.DEBUG)
    assert await say(daemon, conn, "hi") == APOLOGY
    assert "hunter2" not in caplog.text
    assert "Input should be a valid string" in caplog.text  # the log still says why
    await daemon.stop()
