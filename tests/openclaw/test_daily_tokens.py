"""A role's `daily_tokens`: once a user's tokens today (prompt + answer, as /status counts them)
reach it, their messages get a reply that says so and the model is not asked; other users, other
roles and commands go on; a reload that raises the cap lets them in again. Real daemon and
SQLite; a scripted model."""

from __future__ import annotations

from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.openclaw.scripted_model import ScriptedModel
from tests.openclaw.test_daemon import RecordingConnector, msg

CONFIG = """
data_dir = "{data}"
[admin]
enabled = false
[access]
admins = ["terminal:local"]
allow = ["telegram:1", "telegram:2"]
roles = {{ "telegram:1" = "kid" }}
[roles.kid]
skills = ["clock"]
daily_tokens = {cap}
"""


async def test_a_user_past_their_roles_daily_tokens_is_told_and_the_model_not_asked(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text(CONFIG.format(data=tmp_path / "data", cap=40))
    model = ScriptedModel(lambda messages: "an answer of six words here")
    conn = RecordingConnector()
    conn.name = "telegram"
    daemon = Daemon(load_config(path), model=model, connectors=[conn])
    await daemon.start()

    async def say(text: str, user: str) -> str:
        await conn.handler(msg(text, user=user, channel="telegram"))
        await daemon.gateway.wait_idle()
        return conn.texts(user)[-1]

    try:
        assert await say("first question", "1") == "an answer of six words here"
        used = await daemon.store.tokens_today("telegram:1")
        assert used >= 40  # the first turn crossed the cap, and still finished
        asked = len(model.prompts)
        reply = await say("second question", "1")
        assert reply.startswith("You have used today's 40 tokens")
        assert len(model.prompts) == asked  # the model was not asked
        assert await daemon.store.tokens_today("telegram:1") == used  # and nothing was counted
        assert f"you {used} of 40 a day" in await say("/status", "1")  # commands still answer
        # Another user, of a role without a cap, is not affected.
        assert await say("my question", "2") == "an answer of six words here"
        assert "of 40 a day" not in await say("/status", "2")
        path.write_text(CONFIG.format(data=tmp_path / "data", cap=10_000))
        assert (await daemon.reload()).applied == ["roles"]
        assert await say("third question", "1") == "an answer of six words here"
    finally:
        await daemon.stop()
