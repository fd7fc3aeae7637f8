"""Over an OpenAI-compatible server the KV pool is the server's: /status says it is not known
rather than showing numbers of its own, and no warning is made up at start."""

from __future__ import annotations

import logging

from tests.fakes.openai_api import MODEL
from tests.helpers.daemon import say, started


async def test_status_says_the_pool_of_a_remote_server_is_not_known(tmp_path, fake, caplog):
    caplog.set_level(logging.WARNING, logger="openclaw.kv_report")
    daemon, conn = await started(tmp_path, None, f'[engine]\nbackend = "openai"\nurl = "{fake.url}"\n'
                                                 f'model = "{MODEL}"\n')
    try:
        status = await say(daemon, conn, "/status")
        assert "KV pool: not known (remote server)" in status.splitlines()
        assert daemon.metrics.value("openclaw_kv_conversations_fit") == 0  # left out, not guessed
        assert "openclaw_kv_conversations_fit" not in daemon.metrics.render()
        assert not [r for r in caplog.records if r.name == "openclaw.kv_report"]
    finally:
        await daemon.stop(drain_timeout=0)
