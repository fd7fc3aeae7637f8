"""The Telegram tests' world: a fake Bot API (tests/fakes) as the fixture `fake`, and a daemon with a
Telegram connector talking to it as the fixture `env` (an Env, started by the test with its model).
A test module takes the fixtures by naming them at its top: `fake, env = telegram_env.fake, ...`."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.telegram import Backoff, TelegramConnector
from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

ADA = 1001  # the admin, in config


def write_config(tmp_path: Path, fake: FakeTelegram, telegram_extra: str = "") -> Path:
    path = tmp_path / "openclaw.toml"
    path.touch(mode=0o600)  # it holds a token
    path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
admins = ["telegram:{ADA}"]
dm_policy = "pairing"
[admin]
enabled = false
[telegram]
enabled = true
token = "{fake.token}"
base_url = "{fake.base_url}"
base_file_url = "{fake.base_file_url}"
{telegram_extra}
""")
    return path


class Env:
    """The fake Bot API plus, once started, one daemon with a Telegram connector talking to it."""

    def __init__(self, tmp_path: Path, fake: FakeTelegram) -> None:
        self.tmp_path, self.fake = tmp_path, fake
        self.daemon: Daemon | None = None
        self.config = None

    async def start(self, model: ScriptedModel, telegram_extra: str = "", **connector_kw) -> Daemon:
        self.config = load_config(write_config(self.tmp_path, self.fake, telegram_extra))
        options = {"poll_timeout": 5, "backoff": Backoff(0.05, 0.4), **connector_kw}
        connector = TelegramConnector(self.fake.token, base_url=self.fake.base_url,
                                      base_file_url=self.fake.base_file_url, **options)
        self.daemon = Daemon(self.config, model=model, connectors=[connector])
        await self.daemon.start()
        await until(lambda: self.fake.polls_waiting)
        return self.daemon

    async def stop(self) -> None:
        if self.daemon is not None:
            daemon, self.daemon = self.daemon, None
            await daemon.stop(drain_timeout=2)

    async def replies(self, chat: int, count: int, timeout: float = 10.0) -> list[str]:
        """The bot's messages in `chat` once there are `count`; then checks no more came."""
        await until(lambda: len(self.fake.texts(chat)) >= count, timeout)
        await self.daemon.gateway.wait_idle()
        assert len(self.fake.texts(chat)) == count, self.fake.texts(chat)
        return self.fake.texts(chat)


@pytest.fixture
async def fake():
    server = FakeTelegram()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def env(tmp_path, fake):
    environment = Env(tmp_path, fake)
    yield environment
    await environment.stop()
