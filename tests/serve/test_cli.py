"""`openclaw serve` as a user runs it: a real process on the embedded model, answering the official
client; and what it refuses before it loads any model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import openai
import pytest

from tests.helpers.cli import run

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture
def served(tmp_path):
    """`openclaw serve` on the embedded model, its key from the environment and its name from
    the config's [serve]; the process, and its base URL once it says it is up."""
    config = tmp_path / "openclaw.toml"
    config.write_text('[serve]\nserved_model_name = "smol"\n')
    env = {**os.environ, "HOME": str(tmp_path), "SERVE_TEST_KEY": "sesame-4242"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "openclaw.cli", "serve", "--config", str(config), "--port", "0",
         "--api-key", "env:SERVE_TEST_KEY", "--max-connections", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # said once it listens; the model loaded before
        assert line.startswith("serving smol at http://127.0.0.1:"), (line, proc.stderr.read())
        yield proc, line.split(" at ")[1].split()[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.slow
def test_openclaw_serve_answers_the_official_client_from_the_embedded_model(served):
    proc, base_url = served
    client = openai.OpenAI(base_url=base_url, api_key="sesame-4242", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == ["smol"]
    reply = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=20)
    assert "Paris" in reply.choices[0].message.content
    called = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=WEATHER, tool_choice="required", temperature=0, max_tokens=60)
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="nope", max_retries=0).models.list()
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0 and time.monotonic() - started < 30


def test_a_host_beyond_loopback_without_a_key_is_refused_before_the_model_loads(tmp_path):
    done = run(["serve", "--host", "0.0.0.0"], tmp_path, timeout=60)
    assert done.returncode == 2
    assert "serve.api_key" in done.stderr and "0.0.0.0" in done.stderr
    assert "loading the model" not in done.stderr


def test_a_key_written_on_the_command_line_is_refused(tmp_path):
    done = run(["serve", "--api-key", "sesame"], tmp_path, timeout=60)
    assert done.returncode == 2 and "env:NAME or file:PATH" in done.stderr


def test_a_config_whose_engine_is_a_server_is_refused_naming_engine_backend(tmp_path):
    config = tmp_path / "openclaw.toml"
    config.write_text('[engine]\nbackend = "openai"\nurl = "http://127.0.0.1:9/v1"\n')
    done = run(["serve", "--config", str(config)], tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "[engine] backend" in done.stderr and "openai" in done.stderr
    assert "Traceback" not in done.stderr and "loading the model" not in done.stderr


def test_sigterm_with_a_client_mid_stream_ends_its_stream_and_the_process(tmp_path, chat_model):
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "openclaw.cli", "serve", "--model", chat_model, "--port", "0",
         "--max-model-len", "1024", "--kv-cache-gib", "0.004"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), (line, proc.stderr.read())
        client = openai.OpenAI(base_url=line.split(" at ")[1].split()[0], api_key="-",
                               max_retries=0, timeout=120)
        stream = client.chat.completions.create(
            model="chat-model0", messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=900, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        for _ in range(4):  # the role chunk, then content: mid-answer
            next(chunks)
        proc.send_signal(signal.SIGTERM)
        finishes = []
        with pytest.raises(openai.APIError, match="shutting down"):
            for chunk in chunks:
                finishes.append(chunk.choices[0].finish_reason)
        assert not any(finishes)  # ended by the stop, not by its length
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
