"""`[serve] enabled = true`: the daemon serves the same API on its own port, from the model it
already loaded (the weights load once), and stops it with itself."""

from __future__ import annotations

import httpx
import openai
import pytest

from openclaw.backends.local import LocalBackend
from openclaw.config import ConfigError
from openclaw.daemon import Daemon
from tests.helpers.daemon import config, started
from tests.helpers.scripted_model import ScriptedModel

SERVE = "[serve]\nenabled = true\nport = 0\nserved_model_name = \"daemon-model\"\n"


async def test_the_daemon_serves_the_api_from_the_engine_it_already_has(tmp_path, llm):
    daemon, _ = await started(tmp_path, LocalBackend(llm), SERVE)
    try:
        assert daemon.api.state.llm is llm  # no second copy of the weights
        client = openai.AsyncOpenAI(base_url=daemon.api.url + "/v1", api_key="-", max_retries=0)
        assert [m.id for m in (await client.models.list()).data] == ["daemon-model"]
        reply = await client.chat.completions.create(
            model="daemon-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
            extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 3
        url = daemon.api.url
    finally:
        await daemon.stop(drain_timeout=0)
    with pytest.raises(httpx.ConnectError):  # gone with the daemon
        httpx.get(url + "/health")


async def test_serve_needs_the_in_process_engine(tmp_path):
    daemon = Daemon(config(tmp_path, SERVE), model=ScriptedModel(lambda m: "ok"))
    try:
        with pytest.raises(ConfigError, match=r"\[serve\] enabled = true serves the daemon's"):
            await daemon.start()
    finally:
        await daemon.stop(drain_timeout=0)
