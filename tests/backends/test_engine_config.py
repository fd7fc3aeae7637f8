"""`[engine] backend`: the local engine's table (the engine's own EngineConfig) or a server's,
each key checked by the backend that takes it, and every error naming the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.config import EngineConfig
from openclaw.config import Config, ConfigError, OpenAIEngineConfig, exposed_secrets, load_config


def loaded(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "openclaw.toml"
    path.write_text(text)
    os.chmod(path, 0o600)
    return load_config(path)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        loaded(tmp_path, text)
    return info.value.problems


def test_the_default_backend_is_the_local_engine_with_its_own_config(tmp_path):
    assert type(loaded(tmp_path, '[engine]\nbackend = "local"\nmax_num_seqs = 4\n').engine) is EngineConfig
    assert type(Config().engine) is EngineConfig


def test_a_server_backend_takes_its_keys_with_their_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_KEY", "sk-secret")
    engine = loaded(tmp_path, """
[engine]
backend = "openai"
url = "http://127.0.0.1:8000/v1/"
api_key = "env:VLLM_KEY"
model = "Qwen/Qwen3-8B"
tokenizer = "models/qwen3"
context_length = 32768
first_token_timeout = 30
""").engine
    assert isinstance(engine, OpenAIEngineConfig)
    assert engine.url == "http://127.0.0.1:8000/v1" and engine.api_key.get() == "sk-secret"
    assert engine.model == "Qwen/Qwen3-8B" and engine.context_length == 32768
    assert engine.tokenizer == tmp_path / "models/qwen3"  # relative to the file, as paths are
    assert (engine.first_token_timeout, engine.idle_timeout, engine.connect_timeout,
            engine.retries) == (30.0, 60.0, 10.0, 3)
    assert "sk-secret" not in repr(engine) and "sk-secret" not in str(Config.model_dump(
        loaded(tmp_path, '[engine]\nbackend = "openai"\nurl = "http://h/v1"\napi_key = "sk-x"\n')))


def test_an_unknown_backend_names_the_choices(tmp_path):
    assert problems(tmp_path, '[engine]\nbackend = "vllm"\n') == [
        'engine.backend = "vllm": expected "local" (the engine in this process) or "openai" '
        "(an OpenAI-compatible server: vLLM, SGLang, Ollama, llama-server, `openclaw serve`)"]


def test_a_key_of_the_other_backend_says_whose_it_is(tmp_path):
    assert problems(tmp_path, '[engine]\nurl = "http://h:8000/v1"\napi_key = "sk-1"\n') == [
        'engine.url = "http://h:8000/v1": a key of backend = "openai" (an OpenAI-compatible '
        'server), not of backend = "local" (the default); set backend = "openai" to use a server, '
        "or remove it",
        'engine.api_key = ***: a key of backend = "openai" (an OpenAI-compatible server), not of '
        'backend = "local" (the default); set backend = "openai" to use a server, or remove it']
    assert problems(tmp_path, '[engine]\nbackend = "openai"\nurl = "http://h/v1"\n'
                              'max_num_seqs = 8\nmax_model_len = 4096\n') == [
        'engine.max_num_seqs = 8: a key of backend = "local" (the engine in this process), not of '
        'backend = "openai"; remove it',
        'engine.max_model_len = 4096: a key of backend = "local" (the engine in this process), not '
        'of backend = "openai"; here it is context_length']


def test_every_problem_of_a_server_table_is_said_at_once_at_its_key(tmp_path):
    assert problems(tmp_path, '[engine]\nbackend = "openai"\nurl = "ftp://h"\ncontext_length = 0\n'
                              'idle_timeout = "1m"\napi_kye = "sk-2"\n') == [
        'engine.url = "ftp://h": expected a URL starting with http:// or https://',
        "engine.context_length = 0: expected a number >= 1",
        'engine.idle_timeout = "1m": expected a number',
        'engine.api_kye = ***: unknown key in [engine]; did you mean "api_key"?']
    assert problems(tmp_path, '[engine]\nbackend = "openai"\n') == [
        'engine.url: required with backend = "openai", e.g. url = "http://127.0.0.1:8000/v1"']


def test_an_api_key_written_in_a_readable_file_is_said(tmp_path):
    config = loaded(tmp_path, '[engine]\nbackend = "openai"\nurl = "http://h/v1"\napi_key = "sk-3"\n')
    os.chmod(config.source, 0o644)
    assert exposed_secrets(config, config.source) == ["engine.api_key"]


def test_a_server_table_dumps_as_the_file_has_it_and_loads_back(tmp_path):
    config = loaded(tmp_path, '[engine]\nbackend = "openai"\nurl = "http://h/v1"\nmodel = "m"\n')
    dumped = config.model_dump()["engine"]
    assert dumped["backend"] == "openai" and dumped["model"] == "m"
    assert Config.model_validate({"engine": {k: v for k, v in dumped.items() if v is not None}}
                                 ).engine == config.engine
