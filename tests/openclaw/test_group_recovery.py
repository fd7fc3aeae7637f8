"""A group message still unanswered at a restart is answered after it as a group message: its
answer is not streamed into the group as a draft (two members' answers would share one), as in
the run that received it. Real daemon and SQLite; a scripted model."""

from __future__ import annotations

import asyncio

from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.scripted_model import ScriptedModel, last_user
from tests.helpers.waiting import until

GROUP = "group-9"


class DraftingConnector(RecordingConnector):
    """Records the drafts the gateway streams, per chat."""

    streams_drafts = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.drafts: list[tuple[str, str]] = []

    async def draft(self, chat_id: str, text: str) -> None:
        self.drafts.append((chat_id, text))


async def test_a_group_message_recovered_after_a_restart_is_still_a_group_message(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
allow = ["telegram:1"]
[admin]
enabled = false
[telegram]
stream_edits = true
""")

    async def run(model: ScriptedModel) -> tuple[Daemon, DraftingConnector]:
        conn = DraftingConnector("telegram")
        daemon = Daemon(load_config(path), model=model, connectors=[conn])
        await daemon.start()
        return daemon, conn

    stuck = ScriptedModel(lambda m: "never finishes")
    stuck.gate = asyncio.Event()
    daemon, conn = await run(stuck)
    await conn.handler(msg("question in the group", user="1", chat=GROUP, channel="telegram",
                           is_group=True))
    await until(lambda: stuck.prompts)
    await daemon.stop(drain_timeout=0.1)  # aborted: answered after the restart

    daemon, conn = await run(ScriptedModel(lambda m: "answer to " + last_user(m)))
    try:
        await until(lambda: conn.texts(GROUP))
        assert conn.texts(GROUP) == ["answer to question in the group"]
        assert conn.drafts == []  # as before the restart: no draft in a group
    finally:
        await daemon.stop()
