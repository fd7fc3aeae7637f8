"""The test MCP server (tests/fakes/mcp_server.py) as a config names it, and an in-memory pin store
(every tool list at first sight), for the tests of MCP servers as skills."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"
# What the server's program needs, bound read-only in its sandbox: the interpreter's install, our
# venv, the fake's folder (the sandbox has /usr and the like; these live elsewhere here).
PROGRAM = (Path(sys.base_prefix), Path(sys.prefix), FAKE.parent)


def stdio_server(name: str, extra: str = "") -> str:
    """A `[mcp.servers.NAME]` table running the test server over stdio, with `extra` lines."""
    read_only = ", ".join(f'"{p}"' for p in PROGRAM)
    return (f'[mcp.servers.{name}]\ncommand = ["{sys.executable}", "{FAKE}"]\n'
            f"read_only = [{read_only}]\n{extra}")


class MemoryPins:
    """The PinStore a daemon gives (skills/mcp/trust.py), in memory."""

    def __init__(self) -> None:
        self.pins: dict[str, dict[str, str]] = {}

    async def get(self, server):
        return self.pins.get(server)

    async def put(self, server, pins):
        self.pins[server] = dict(pins)

    async def saw(self, server, seen, notes):
        pass


def config_folder(body: str) -> tuple[Path, Path]:
    """A folder under /tmp holding openclaw.toml (data_dir inside it, no admin port) with `body`:
    (the folder, the file). Not pytest's tmp_path: /tmp/pytest-of-root is 0700, which the sandbox
    uid cannot walk through."""
    root = Path(tempfile.mkdtemp(prefix="openclaw-mcp-", dir="/tmp"))
    path = root / "openclaw.toml"
    path.write_text(f'data_dir = "{root}/data"\n[admin]\nenabled = false\n' + body)
    return root, path
