"""`openclaw doctor` with `[engine] backend = "openai"`: the server reachable, the model listed,
its context length, how prompts are counted, and a tool call it makes when one is required."""

from __future__ import annotations

import argparse
import asyncio
import threading

import pytest

from openclaw.backends.probe import check_server
from openclaw.cli.doctor import cmd_doctor
from openclaw.config import OpenAIEngineConfig
from tests.fakes.openai_api import MODEL, FakeOpenAI, Reply


def calls_when_required(body: dict) -> Reply | str:
    if body.get("tool_choice") == "required":
        return Reply(tool_calls=[("get_time", {"timezone": "UTC"})])
    return "no tools here"


@pytest.fixture
async def fake():
    server = FakeOpenAI()
    server.reply = calls_when_required
    await server.start()
    yield server
    await server.stop()


def marks(checks) -> list[tuple]:
    return [(mark, what.split(":")[0]) for mark, what, _ in checks]


async def test_a_server_that_does_all_the_daemon_needs_passes(fake):
    checks = await check_server(OpenAIEngineConfig(url=fake.url))
    assert marks(checks) == [(True, "model server"), (True, "model"), (True, "token counts"),
                             (True, "tool calls")]
    assert f"model: {MODEL}, context 4096 tokens (the server's max_model_len)" == checks[1][1]
    assert "exact, from the server's /tokenize" in checks[2][1]
    assert fake.chats[-1]["tool_choice"] == "required"


async def test_a_server_that_does_not_call_when_required_is_a_warning_with_the_fix(fake):
    fake.reply = lambda body: "I would rather not"
    fake.tokenize = False
    checks = await check_server(OpenAIEngineConfig(url=fake.url, model=MODEL))
    assert marks(checks)[2:] == [("warn", "token counts"), ("warn", "tool calls")]
    assert "--enable-auto-tool-choice" in checks[3][2]
    assert "engine.tokenizer" in checks[2][2]


async def test_what_stops_the_daemon_fails_with_the_key_to_fix(fake):
    fake.max_model_len = None
    [reachable, model] = await check_server(OpenAIEngineConfig(url=fake.url))
    assert reachable[0] is True and model[0] is False and "context_length" in model[1]
    [_, listed] = await check_server(OpenAIEngineConfig(url=fake.url, model="other"))
    assert listed[0] is False and 'model "other" is not served' in listed[1]
    await fake.stop()
    [down] = await check_server(OpenAIEngineConfig(url=fake.url))
    assert down[0] is False and "not reachable" in down[1] and "engine.url" in down[2]


def test_doctor_prints_the_servers_checks(tmp_path, capsys):
    fake = FakeOpenAI()
    fake.reply = calls_when_required
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(10)
    try:
        config = tmp_path / "openclaw.toml"
        config.write_text(f'data_dir = "{tmp_path / "data"}"\n[admin]\nenabled = false\n'
                          f'[engine]\nbackend = "openai"\nurl = "{fake.url}"\n')
        config.chmod(0o600)
        cmd_doctor(argparse.Namespace(config=config, skip_model=False))
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    out = capsys.readouterr().out
    assert f"✓ model server: {fake.url} answers" in out
    assert "✓ tool calls: the server answered a constrained probe with a call" in out
