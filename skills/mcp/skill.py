"""An MCP server's tool as a skill named `SERVER.TOOL`: its cleaned description, its JSON Schema as
the arguments (the constrained decoder enforces it), and a run that calls the server for the
calling principal. It goes through the executor like any skill (role, arguments, approval, audit);
its output is untrusted content, and a call is taken to act (a server's own hints are its claims)."""

from __future__ import annotations

from typing import Any

from skills.base import Skill, SkillContext, SkillError
from skills.mcp.connection import ServerDown, result_text
from skills.mcp.servers import McpServers
from skills.mcp.trust import CleanTool
from skills.registry import SkillRegistry


def tool_name(server: str, tool: str) -> str:
    return f"{server}.{tool}"


class McpToolSkill(Skill):
    name = "mcp"  # each instance sets its own
    description = ""
    side_effects = True
    untrusted_output = True

    def __init__(self, servers: McpServers, server: str, tool: CleanTool) -> None:
        self.servers, self.server, self.tool = servers, server, tool
        self.name = tool_name(server, tool.name)
        spec = servers.specs[server]
        self.description = f"{tool.description} (tool of the MCP server {server})".strip()
        schema = dict(tool.input_schema) if isinstance(tool.input_schema, dict) else {}
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self.parameters = schema
        self.permissions = frozenset({"network"} if spec.url or spec.network else {"exec"})

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        try:
            result = await self.servers.call(self.server, self.tool.name, args, ctx.principal)
        except ServerDown as exc:
            raise SkillError(f"the MCP server {self.server} cannot answer: {exc}") from None
        text, failed = result_text(result)
        if failed:
            ctx.audit.failed = True
            ctx.audit.detail = f"the server said the call failed: {text[:400]}"
            return f"error (from the MCP server {self.server}): {text}"
        return text


def add_tools(registry: SkillRegistry, servers: McpServers) -> None:
    """Put every discovered tool in `registry` as `SERVER.TOOL`; a server that could not start
    is noted among the skipped (doctor and the start-up log say why)."""
    for server, tools in servers.discovered.items():
        origin = f"MCP server {server} ({servers.specs[server].where})"
        for tool in tools:
            registry.add(McpToolSkill(servers, server, tool), origin)
    for server, why in servers.failed.items():
        registry.skip(f"mcp:{server}", f"mcp:{server}: not offered: {why}")
