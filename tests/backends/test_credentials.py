"""The server's credentials (the API key, a password in the URL) never reach a log line, an error,
/status or `openclaw doctor`: messages about the model go to the owner's chat."""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

import pytest

from engine import SamplingParams
from openclaw.agent.model import ModelUnavailable
from openclaw.backends import shown_url
from openclaw.backends.openai import OpenAIBackend
from openclaw.backends.probe import check_server
from openclaw.config import OpenAIEngineConfig, Secret
from openclaw.gateway import turn
from openclaw.gateway.turn import MODEL_AWAY
from tests.fakes.openai_api import MODEL
from tests.helpers.daemon import msg, say, started
from tests.helpers.waiting import until

KEY = "sk-test-5ecret-4242"
PASSWORD = "pa55-w0rd-77"
HELLO = [{"role": "user", "content": "hello"}]


def everything_said(caplog, *more: object) -> str:
    return "\n".join([r.getMessage() for r in caplog.records] + [str(m) for m in more])


async def test_a_key_the_server_echoes_in_its_refusal_is_not_repeated(fake, caplog):
    caplog.set_level(logging.DEBUG)
    fake.api_key = "the-right-one"
    config = OpenAIEngineConfig(url=fake.url, model=MODEL, api_key=Secret(KEY))
    with pytest.raises(ValueError, match=r"HTTP 401: Incorrect API key provided: \*\*\*") as refused:
        await OpenAIBackend.open(config)
    checks = await check_server(config, tool_probe=False)
    assert KEY not in everything_said(caplog, refused.value, checks)


async def test_a_password_in_the_url_is_not_shown(fake, caplog):
    caplog.set_level(logging.DEBUG)
    url = fake.url.replace("http://", f"http://bob:{PASSWORD}@")
    backend = await OpenAIBackend.open(OpenAIEngineConfig(url=url, model=MODEL, retries=1))
    assert backend.stats()["device"] == fake.url.replace("http://", "http://***@")  # /status
    await fake.stop()
    with pytest.raises(ModelUnavailable) as away:
        async with aclosing(backend.generate(HELLO, SamplingParams(max_tokens=8))) as stream:
            [_ async for _ in stream]
    checks = await check_server(OpenAIEngineConfig(url=url, model=MODEL))
    assert "cannot connect" in str(away.value) and "***@" in str(away.value)
    assert PASSWORD not in everything_said(caplog, away.value, checks)
    await backend.close()


@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("https://bob:secret@host/v1", "https://***@host/v1"),
    ("https://token@host/v1", "https://***@host/v1"),
    ("https://host/v1?key=secret", "https://host/v1?***"),
])
def test_how_a_url_is_shown(url, expected):
    assert shown_url(url) == expected


async def test_the_daemon_says_nothing_of_them_in_its_log_status_or_messages(tmp_path, fake, caplog,
                                                                            monkeypatch):
    monkeypatch.setattr(turn, "MODEL_RETRY_S", 0.05)
    caplog.set_level(logging.DEBUG)
    url = fake.url.replace("http://", f"http://bob:{PASSWORD}@")
    daemon, conn = await started(tmp_path, None, f'[engine]\nbackend = "openai"\nurl = "{url}"\n'
                                                 f'model = "{MODEL}"\n')
    assert await say(daemon, conn, "hi") == "hello from the fake"
    assert (await say(daemon, conn, "/status")).startswith("Model: fake-model on http://***@")
    await fake.stop()
    await conn.handler(msg("again"))
    await until(lambda: len(conn.texts()) == 3)
    assert conn.texts()[2].startswith(MODEL_AWAY) and "cannot connect" in conn.texts()[2]
    await asyncio.wait_for(daemon.stop(), 5)
    said = everything_said(caplog, *conn.texts())
    assert "loading the model" in said and PASSWORD not in said


async def test_a_key_beside_a_password_in_the_url_is_a_config_error(fake):
    url = fake.url.replace("http://", f"http://bob:{PASSWORD}@")
    config = OpenAIEngineConfig(url=url, model=MODEL, api_key=Secret(KEY))
    with pytest.raises(ValueError, match="keep one") as refused:
        await OpenAIBackend.open(config)
    [(ok, what, fix)] = await check_server(config)
    assert ok is False and "keep one" in what
    assert PASSWORD not in str(refused.value) + what and KEY not in str(refused.value) + what
