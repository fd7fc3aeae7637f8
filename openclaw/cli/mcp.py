"""`openclaw mcp list` and `openclaw mcp trust NAME`: the MCP servers whose tool lists were seen,
which of their tools are withheld from the model (new, or changed since the admin trusted them),
and the admin's approval of a server's tool list as last listed. They change only the store, so
they work while the daemon runs."""

from __future__ import annotations

import argparse
import sys

from openclaw.cli.common import with_store
from openclaw.store.mcp_pins import McpServerState, ToolTrust, UnknownMcpServerError
from skills.base import visible

_SHOWN = {ToolTrust.TRUSTED: "trusted", ToolTrust.ADDED: "WITHHELD (new)",
          ToolTrust.CHANGED: "WITHHELD (changed since trusted)",
          ToolTrust.REMOVED: "removed (no longer listed)"}


def add_commands(sub, common_sub) -> None:
    mcp = common_sub(sub.add_parser("mcp", help="MCP servers' tools: which are withheld, trust them")
                     .add_subparsers(dest="mcp_cmd", required=True))
    mcp.add_parser("list", help="each MCP server seen, its tools, and which are withheld and why") \
        .set_defaults(func=cmd_mcp_list)
    p = mcp.add_parser("trust", help="trust NAME's tool list as last listed: its withheld tools "
                                     "are offered from the next time its tools are listed")
    p.add_argument("name")
    p.set_defaults(func=cmd_mcp_trust)


def cmd_mcp_list(args: argparse.Namespace) -> int:
    servers = with_store(args, lambda store: store.mcp_servers(), none_yet=[])
    if not servers:
        print("no MCP server's tools seen yet (the daemon or `openclaw doctor` lists them)")
        return 0
    for server in servers:
        print(server_block(server))
    return 0


def server_block(server: McpServerState) -> str:
    """A server as the admin reads it: its tools, each with its trust and, where withheld, the
    description it now has (cleaned, and escaped again here: a terminal shows only what is there)."""
    trusted = f"{server.trusted_at:%Y-%m-%d %H:%M} UTC" if server.trusted_at else "never"
    lines = [f"{server.name}  (last listed {server.seen_at:%Y-%m-%d %H:%M} UTC, trusted {trusted})"]
    for tool in server.tools:
        lines.append(f"  {tool.name}  {_SHOWN[tool.trust]}")
        if tool.trust in (ToolTrust.ADDED, ToolTrust.CHANGED) and tool.note:
            lines.append(f"    now: {visible(tool.note)}")
    if not server.tools:
        lines.append("  no tools")
    if server.withheld:
        lines.append(f"  to offer the withheld tools: openclaw mcp trust {server.name}")
    return "\n".join(lines)


def cmd_mcp_trust(args: argparse.Namespace) -> int:
    try:
        before = with_store(args, lambda store: store.mcp_trust(args.name), none_yet=None)
    except UnknownMcpServerError as exc:
        print(f"openclaw mcp trust: {exc}", file=sys.stderr)
        return 1
    if before is None:
        print(f"openclaw mcp trust: no tool list of MCP server {args.name!r} was seen yet "
              "(there is no database yet)", file=sys.stderr)
        return 1
    changed = [t for t in before.tools if t.trust is not ToolTrust.TRUSTED]
    if not changed:
        print(f"{before.name}: nothing withheld; its tool list was already trusted")
        return 0
    print(f"{before.name}: trusted its tool list as last listed")
    for tool in changed:
        verb = {ToolTrust.ADDED: "now offered (was new)", ToolTrust.CHANGED: "now offered (had "
                "changed)", ToolTrust.REMOVED: "forgotten (no longer listed)"}[tool.trust]
        print(f"  {tool.name}  {verb}")
    print("the daemon offers them from the next time it lists the server's tools")
    return 0
