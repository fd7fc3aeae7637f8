"""For tests of the outbox: a daemon whose retries come fast, and a connector whose sends hang until
released (a long 429 wait, a dead network)."""

from __future__ import annotations

import asyncio

from openclaw.daemon import Daemon
from tests.helpers.daemon import RecordingConnector, config
from tests.helpers.scripted_model import ScriptedModel


async def start(tmp_path, conn, reply=lambda m: "reply to: " + m[-1]["content"]) -> Daemon:
    """The daemon with `conn` only, answering with `reply`; its outbox retries within 0.1 s."""
    daemon = Daemon(config(tmp_path), model=ScriptedModel(reply), connectors=[conn])
    await daemon.start()
    daemon.gateway.outbox.first_delay_s = 0.02  # the production backoff starts at 1 s
    daemon.gateway.outbox.max_delay_s = 0.1
    return daemon


class SlowConnector(RecordingConnector):
    """A send that never completes (a long 429 wait, a dead network) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def send_text(self, chat_id: str, text: str) -> str:
        await self.release.wait()
        return await super().send_text(chat_id, text)
