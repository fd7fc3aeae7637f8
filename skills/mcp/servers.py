"""The configured MCP servers and their running instances: one per server, or one per user for a
`per_user` server. An instance starts on its first call, stops after `idle_s` without one, and
after a crash answers a clear error until its backoff has passed, when the next call starts it
again. Each start lists the tools anew and has them reviewed (skills.mcp.trust): a tool withheld
there answers an error, whatever the registry was told at discovery."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sandbox.policy import Principal, sandbox_uid
from sandbox.scope import Limits, Scope
from sandbox.service import Service, start_service
from skills.mcp.connection import Connection, ServerDown
from skills.mcp.trust import CleanTool, PinStore, review

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 300.0


@dataclass(frozen=True)
class ServerSpec:
    """One `[mcp.servers.NAME]` as the daemon resolved it (secrets read, paths absolute)."""

    name: str
    command: tuple[str, ...] = ()  # stdio, sandboxed; or
    url: str | None = None  # streamable HTTP
    # repr=False: a token in a header or the environment never reaches a log through a spec.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    env: dict[str, str] = field(default_factory=dict, repr=False)
    tools: tuple[str, ...] | None = None  # the allow-list; None: every tool
    per_user: bool = False
    network: bool = False
    read_only: tuple[Path, ...] = ()  # the server's own program (a venv), bound read-only
    workspace: Path | None = None  # a shared stdio server's own, never a user's
    idle_s: float = 300.0
    backoff_s: float = 1.0

    @property
    def where(self) -> str:
        return self.url or " ".join(self.command)


@dataclass(frozen=True)
class Sandboxing:
    """What the daemon's [sandbox] says about running programs (sandbox.runner.Sandbox's fields)."""

    bwrap_path: str | None = None
    allow_unsandboxed: bool = False


class Instance:
    """One running (or stopped) server: for everyone, or for one user."""

    def __init__(self, spec: ServerSpec, launch: Callable[[], Awaitable[Service]] | None,
                 pins: PinStore) -> None:
        self.spec, self._launch, self._pins = spec, launch, pins
        self.connection: Connection | None = None
        self.allowed: dict[str, CleanTool] = {}
        self.failures = 0
        self.retry_at = 0.0
        self.last_error = ""
        self.busy = 0
        self._lock = asyncio.Lock()
        self._idle: asyncio.TimerHandle | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> bool:
        return self.connection is not None and self.connection.alive

    async def ensure(self) -> Connection:
        """The live connection, started now if need be; ServerDown while backing off a crash."""
        async with self._lock:
            if self.connection is not None and self.connection.alive:
                return self.connection
            if self.connection is not None:  # it ended without our stop: a crash
                self._crashed(self.connection.why_ended or "it ended")
            if (wait := self.retry_at - time.monotonic()) > 0:
                raise ServerDown(f"it failed ({self.last_error}); it is started again at the "
                                 f"first call after {wait:.1f} s")
            connection = Connection(self._launch or self.spec.url or "", self.spec.headers)
            try:
                await connection.open()
            except ServerDown as exc:
                self.connection = None
                self._crashed(f"it could not start: {exc}")
                raise ServerDown(f"it could not start: {exc}") from None
            self.connection = connection
            found = await review(self.spec.name, connection.tools, self._pins, log)
            self.allowed = {t.name: t for t in found.allowed if self._listed(t.name)}
            log.info("mcp server %s started (%s); tools: %s", self.spec.name,
                     connection.service.isolation if connection.service else "http",
                     ", ".join(self.allowed) or "none")
            return connection

    def _listed(self, tool: str) -> bool:
        return self.spec.tools is None or tool in self.spec.tools

    def _crashed(self, why: str) -> None:
        self.connection = None
        self.failures += 1
        self.last_error = why
        delay = min(self.spec.backoff_s * 2 ** (self.failures - 1), MAX_BACKOFF_S)
        self.retry_at = time.monotonic() + delay
        log.warning("mcp server %s failed (%s); started again at the first call after %.1f s",
                    self.spec.name, why, delay)

    async def backoff_over(self) -> None:
        """Returns once a call may start the server again."""
        await asyncio.sleep(max(0.0, self.retry_at - time.monotonic()))

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        self.busy += 1
        try:
            connection = await self.ensure()
            if tool not in self.allowed:
                raise ServerDown(f"its tool {tool!r} is withheld: it is new or changed since the "
                                 f"admin trusted the list (`openclaw mcp trust {self.spec.name}`), "
                                 "or not in the server's tools allow-list")
            try:
                result = await connection.call(tool, arguments)
            except ServerDown as exc:
                async with self._lock:
                    if self.connection is connection:
                        self._crashed(str(exc))
                raise ServerDown(f"it failed during the call ({exc}); it is started again at "
                                 f"the first call after {self.retry_at - time.monotonic():.1f} s") from None
            self.failures = 0
            return result
        finally:
            self.busy -= 1
            self._arm_idle()

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(self.spec.idle_s, self._idle_check)

    def _idle_check(self) -> None:
        if self.busy == 0 and self.connection is not None:
            task = asyncio.create_task(self.stop("idle"))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def stop(self, why: str = "stopped") -> None:
        if self._idle is not None:
            self._idle.cancel()
        async with self._lock:
            connection, self.connection = self.connection, None
            if connection is not None:
                await connection.close()
                log.info("mcp server %s stopped (%s)", self.spec.name, why)


class McpServers:
    """Every configured server, their instances, and the tools found at discovery."""

    def __init__(self, specs: list[ServerSpec], pins: PinStore,
                 sandboxing: Sandboxing = Sandboxing()) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self._pins, self._sandboxing = pins, sandboxing
        self._instances: dict[tuple[str, str | None], Instance] = {}
        self.discovered: dict[str, list[CleanTool]] = {}
        self.failed: dict[str, str] = {}  # server -> why its tools are not offered

    def instance(self, name: str, principal: Principal | None) -> Instance:
        """The instance serving `principal` (theirs for a per_user server; None: a probe's own)."""
        spec = self.specs[name]
        user = principal.user if spec.per_user and principal is not None else None
        key = (name, user if spec.per_user and principal is not None else None)
        if key not in self._instances:
            launch = None if spec.url else self._launcher(spec, principal if user else None)
            self._instances[key] = Instance(spec, launch, self._pins)
        return self._instances[key]

    def _launcher(self, spec: ServerSpec, principal: Principal | None
                  ) -> Callable[[], Awaitable[Service]]:
        if principal is not None:  # the user's workspace, uid, grants and limits
            scope = principal.scope
            scope = replace(scope, network=spec.network and scope.network,
                            read_only=scope.read_only + spec.read_only)
            limits = principal.limits
        else:  # a workspace and a uid of its own
            assert spec.workspace is not None, "a shared stdio server needs its own workspace"
            spec.workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
            scope = Scope(spec.workspace, read_only=spec.read_only, network=spec.network,
                          uid=sandbox_uid(f"mcp:{spec.name}"))
            limits = Limits()
        sandboxing = self._sandboxing

        async def launch() -> Service:
            return await start_service(list(spec.command), scope, limits,
                                       bwrap_path=sandboxing.bwrap_path,
                                       allow_unsandboxed=sandboxing.allow_unsandboxed, env=spec.env)
        return launch

    async def discover(self, name: str) -> list[CleanTool]:
        """Start `name` once (a per_user server in a workspace of its own, as no user), list and
        review its tools, stop it. ServerDown when it cannot start."""
        instance = self.instance(name, None)
        try:
            await instance.ensure()
            tools = list(instance.allowed.values())
        finally:
            await instance.stop("listed its tools")
        self.discovered[name] = tools
        self.failed.pop(name, None)
        return tools

    async def discover_all(self) -> None:
        """Every server's tools, at once; one that cannot start is logged and left out."""
        names = list(self.specs)
        found = await asyncio.gather(*(self.discover(n) for n in names), return_exceptions=True)
        for name, result in zip(names, found, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                self.failed[name] = str(result)
                log.warning("mcp server %s: its tools are not offered: %s", name, result)

    async def call(self, name: str, tool: str, arguments: dict[str, Any], principal: Principal) -> Any:
        return await self.instance(name, principal).call(tool, arguments)

    async def close(self) -> None:
        await asyncio.gather(*(i.stop("the daemon stops") for i in self._instances.values()))
