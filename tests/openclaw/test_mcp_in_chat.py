"""An MCP server's tools inside the running daemon: found at its start, offered to the model with
their schema, called through the caller's role in the sandboxed server, audited, and stopped
with the daemon."""

from __future__ import annotations

import json
import shutil

from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.mcp import config_folder, stdio_server
from tests.helpers.replies import answer
from tests.helpers.scripted_model import ScriptedModel


async def test_the_model_calls_a_sandboxed_mcp_tool_and_reads_its_contained_result():
    root, path = config_folder('[access]\nallow = ["telegram:7"]\nroles = { "telegram:7" = "dev" }\n'
                               '[roles.dev]\nskills = ["mcp:t"]\n' + stdio_server("t", "per_user = true\n"))
    offered: list[list[str]] = []

    def reply(messages: list[dict]) -> str:
        tools = [m["content"] for m in messages if m["role"] == "tool"]
        if tools:
            return "RESULT: " + tools[-1]
        return "<tool_call>" + json.dumps({"name": "t.read", "arguments": {"path": "/etc/shadow"}}) \
            + "</tool_call>"

    class Recording(ScriptedModel):
        def encode_chat(self, messages, tools=None):
            offered.append([t["function"]["name"] for t in tools or []])
            return super().encode_chat(messages, tools)

    model = Recording(reply)
    conn = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=model, connectors=[conn])
    await daemon.start()
    try:
        assert daemon.mcp is not None and not daemon.mcp.instance("t", None).running
        await conn.handler(msg("read the shadow file", user="7", channel="telegram"))
        await daemon.gateway.wait_idle()
        assert any("t.read" in names and "t.echo" in names for names in offered)
        assert answer(conn.texts("7")[-1]).startswith("RESULT: BLOCKED: FileNotFoundError")
        [row] = await daemon.store.list_audit()
        assert (row.user, row.skill, row.decision, row.arguments) == (
            "telegram:7", "t.read", "allowed", {"path": "/etc/shadow"})
        instance = daemon.mcp.instance("t", daemon.config.policy().principal("telegram:7"))
        assert instance.running
    finally:
        await daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not instance.running  # stopped with the daemon
