"""`[mcp.servers.NAME]`: MCP servers whose tools become skills named `NAME.TOOL`. A stdio server
(`command`) runs in the sandbox, shared or one per user; a URL is streamable HTTP, its `headers`
may be `env:NAME` / `file:PATH` references, read when the servers are built and never logged."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from openclaw.config.fields import ConfigPath, Section, check_url
from openclaw.config.secrets import BaseDirInfo, resolve_reference

if TYPE_CHECKING:
    from sandbox.policy import Role
    from skills.mcp.servers import ServerSpec

SERVER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


class McpServerConfig(Section):
    command: list[str] | None = None
    """The program and its arguments (stdio); it runs sandboxed, its working folder /workspace."""
    url: str | None = None
    """A streamable HTTP endpoint instead of a command."""
    headers: dict[str, str] = {}
    """Sent with every HTTP request; values may be "env:NAME" or "file:PATH"."""
    env: dict[str, str] = {}
    """Environment variables for a stdio server (its environment is otherwise clean)."""
    roles: list[str] = []
    """Roles that may use its tools ([roles.X] skills may also name "mcp:NAME")."""
    tools: list[str] | None = None
    """Only these tools are offered; default every tool."""
    per_user: bool = False
    """One server per user: their workspace at /workspace, their uid, their role's limits."""
    network: bool = False
    """Whether it may use the network (also only where the user's role grants it)."""
    read_only: list[ConfigPath] = []
    """Folders its program needs, bound read-only (a virtual environment, its install folder)."""
    idle_s: float = Field(300.0, gt=0)
    """A running server with no call for this long is stopped; the next call starts it again."""
    backoff_s: float = Field(1.0, gt=0)
    """After a crash the server is started again no sooner than this, doubled at each crash in a row."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a program run sandboxed, over stdio) or url "
                             "(streamable HTTP), not both nor neither")
        if self.command is not None and not (self.command and self.command[0]):
            raise ValueError('command: name the program, e.g. ["uvx", "mcp-server-git"]')
        check_url(self.url, ("http", "https"))
        if self.url is not None and (self.per_user or self.network or self.read_only or self.env):
            raise ValueError("per_user, network, read_only and env are for a command; a url "
                             "server runs elsewhere")
        if self.command is not None and self.headers:
            raise ValueError("headers are for a url server")
        return self


class McpConfig(Section):
    servers: dict[str, McpServerConfig] = {}

    @model_validator(mode="after")
    def _names(self) -> McpConfig:
        bad = [name for name in self.servers if not SERVER_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"servers: names are a letter, then letters, digits, _ or - (at "
                             f"most 32); got {bad}")
        return self


def server_specs(section: McpConfig, data_dir: Path, base: Path | None
                 ) -> tuple[list[ServerSpec], list[str]]:
    """The servers as skills.mcp takes them, header references read; and a problem (naming the
    key, never the value) for each that cannot be."""
    from skills.mcp.servers import ServerSpec

    specs, problems = [], []
    info = None if base is None else BaseDirInfo(base)
    for name, table in section.servers.items():
        headers = {}
        for key, value in table.headers.items():
            try:
                headers[key] = resolve_reference(value, info)[0]
            except PydanticCustomError as exc:
                problems.append(f"mcp.servers.{name}.headers.{key}: {exc.message()}")
        specs.append(ServerSpec(
            name, command=tuple(table.command or ()), url=table.url, headers=headers,
            env=dict(table.env), tools=None if table.tools is None else tuple(table.tools),
            per_user=table.per_user, network=table.network, read_only=tuple(table.read_only),
            workspace=data_dir / "mcp" / name, idle_s=table.idle_s, backoff_s=table.backoff_s))
    return specs, problems


def with_mcp_grants(section: McpConfig, roles: dict[str, Role]) -> dict[str, Role]:
    """Each role with "mcp:NAME" among its skills for every server whose `roles` names it."""
    from sandbox.policy import MCP_GRANT  # as Config.policy: only when used

    granted = dict(roles)
    for name, table in section.servers.items():
        for role in table.roles:
            if role in granted:
                granted[role] = replace(granted[role],
                                        skills=granted[role].skills | {MCP_GRANT + name})
    return granted


def role_problems(section: McpConfig, known_roles: set[str]) -> list[str]:
    """A server's `roles` naming a role that is not defined would grant nothing, silently."""
    return [f"mcp.servers.{name}.roles: unknown role {role!r}; roles: {', '.join(sorted(known_roles))}"
            for name, table in section.servers.items() for role in table.roles
            if role not in known_roles]
