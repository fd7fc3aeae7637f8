"""`openclaw doctor`'s lines for [mcp.servers.*]: each server started once, as the daemon starts
it, and its tools listed (those withheld until trusted left out: `openclaw mcp list` says which)."""

from __future__ import annotations

import asyncio

from openclaw.config import Config, ConfigError
from skills import SkillRegistry


def check_mcp_servers(config: Config) -> list[tuple[bool, str, str]]:
    from openclaw.skillset import mcp_session

    if not config.mcp.servers:
        return []

    async def look():
        async with mcp_session(config, SkillRegistry()) as servers:
            return servers

    try:
        servers = asyncio.run(look())
    except ConfigError as exc:
        return [(False, f"mcp: {'; '.join(exc.problems)}", "fix [mcp.servers] in the config")]
    checks = []
    for name, spec in servers.specs.items():
        if name in servers.failed:
            checks.append((False, f"mcp server {name} ({spec.where}): {servers.failed[name]}",
                           "check its command or url (and read_only: the folders its program "
                           "needs in the sandbox)"))
        else:
            tools = ", ".join(t.name for t in servers.discovered[name]) or "none"
            checks.append((True, f"mcp server {name} ({spec.where}): tools {tools}", ""))
    return checks
