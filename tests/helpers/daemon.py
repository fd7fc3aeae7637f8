"""The daemon in process, as most daemon tests drive it: a connector that records what it is sent,
a config with pairing and no admin port, messages as a connector hands them in, and a started
daemon to say things to."""

from __future__ import annotations

import asyncio
import itertools

from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.gateway.contract import InboundMessage
from openclaw.prompts.eval_run import EvalConnector

_ids = itertools.count()


class RecordingConnector(EvalConnector):
    """A connector that records what the daemon sends, per chat. The terminal's (by default) has
    one user, the console's owner "local"; stand-ins for everyone else come through a remote
    channel, `RecordingConnector("telegram")`, named by numeric id as Telegram names them."""

    def __init__(self, name: str = "terminal") -> None:
        super().__init__(name)
        self.new_message = asyncio.Event()

    async def send_text(self, chat_id: str, text: str) -> str:
        sent = await super().send_text(chat_id, text)
        self.new_message.set()
        return sent

    def texts(self, chat_id: str | None = None) -> list[str]:
        return [t for c, t in self.sent if chat_id is None or c == chat_id]


def config(tmp_path, extra: str = ""):
    path = tmp_path / "openclaw.toml"
    path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
admins = ["terminal:local"]
dm_policy = "pairing"
[admin]
enabled = false
[agent]
temperature = 0.0
{extra}
""")
    return load_config(path)


def msg(text: str, user: str = "local", chat: str | None = None, mid: str | None = None,
        channel: str = "terminal", is_group: bool = False) -> InboundMessage:
    return InboundMessage(channel, user, chat or user, mid or f"m{next(_ids)}", text, is_group=is_group)


async def started(tmp_path, model, extra: str = "",
                  also: tuple[RecordingConnector, ...] = ()) -> tuple[Daemon, RecordingConnector]:
    """The daemon with the terminal's connector, and `also` these (a remote channel's)."""
    conn = RecordingConnector()
    daemon = Daemon(config(tmp_path, extra), model=model, connectors=[conn, *also])
    await daemon.start()
    return daemon, conn


async def say(daemon: Daemon, conn: RecordingConnector, text: str, **kw) -> str:
    """`text` sent through `conn` (by default from the console's owner), and the reply to it."""
    before = len(conn.sent)
    await conn.handler(msg(text, **{"channel": conn.name, **kw}))
    await daemon.gateway.wait_idle()
    assert len(conn.sent) > before, f"no reply to {text!r}"
    return conn.sent[-1][1]
