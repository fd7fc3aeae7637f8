"""Tokens a turn spent are counted toward its user's `daily_tokens` however the turn ends: also
when /stop or /new cut it short, so stopping each answer near its end does not get around the
cap. Real daemon and SQLite; a scripted model."""

from __future__ import annotations

import asyncio

from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

CONFIG = """
data_dir = "{data}"
[admin]
enabled = false
[access]
allow = ["telegram:1"]
roles = {{ "telegram:1" = "kid" }}
[roles.kid]
skills = ["clock"]
daily_tokens = 40
"""


async def test_a_turn_cut_short_by_stop_still_counts_its_tokens(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text(CONFIG.format(data=tmp_path / "data"))
    model = ScriptedModel(lambda messages: "a long answer " * 30)
    conn = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=model, connectors=[conn])
    await daemon.start()
    try:
        model.gate = asyncio.Event()  # the stream stalls after its first chunk
        await conn.handler(msg("tell me a long story", user="1", channel="telegram"))
        await until(lambda: model.generated)
        await conn.handler(msg("/stop", user="1", channel="telegram"))
        await daemon.gateway.wait_idle()
        assert conn.texts("1") == ["Stopped."]
        # The prompt was read and a piece of the answer generated: both are counted.
        assert await daemon.store.tokens_today("telegram:1") >= 40
        model.gate = None
        await conn.handler(msg("another story", user="1", channel="telegram"))
        await daemon.gateway.wait_idle()
        assert conn.texts("1")[-1].startswith("You have used today's 40 tokens")
        assert len(model.prompts) == 1  # the model was not asked again
    finally:
        await daemon.stop()
