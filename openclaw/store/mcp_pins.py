"""The pins of MCP servers' tools (skills/mcp/trust.py): per server, each tool's fingerprint as the
admin trusts it and as last listed. `McpPins(store)` is the `PinStore` the MCP skills are given;
`openclaw mcp list` and `openclaw mcp trust NAME` read and approve through the same Store calls."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import StoreBase
from openclaw.store.models import McpServerRow, McpToolRow


class ToolTrust(StrEnum):
    TRUSTED = "trusted"   # listed as pinned: offered
    ADDED = "added"       # listed, never trusted: withheld
    CHANGED = "changed"   # listed, differs from its pin: withheld
    REMOVED = "removed"   # pinned, no longer listed: gone (trusting forgets it)


@dataclass(frozen=True)
class McpToolState:
    name: str
    trust: ToolTrust
    note: str | None  # the cleaned description, cut short, as last listed


@dataclass(frozen=True)
class McpServerState:
    name: str
    first_seen_at: datetime
    seen_at: datetime
    trusted_at: datetime | None
    tools: tuple[McpToolState, ...]

    @property
    def withheld(self) -> list[str]:
        return [t.name for t in self.tools if t.trust in (ToolTrust.ADDED, ToolTrust.CHANGED)]


class UnknownMcpServerError(LookupError):
    """`openclaw mcp trust NAME` for a server whose tool list was never seen."""


def _trust(row: McpToolRow) -> ToolTrust | None:
    if row.seen is None:
        return ToolTrust.REMOVED if row.pinned is not None else None
    if row.pinned is None:
        return ToolTrust.ADDED
    return ToolTrust.TRUSTED if row.pinned == row.seen else ToolTrust.CHANGED


def _state(row: McpServerRow, tools: Iterable[McpToolRow]) -> McpServerState:
    states = tuple(McpToolState(t.name, trust, t.note)
                   for t in sorted(tools, key=lambda t: t.name) if (trust := _trust(t)) is not None)
    return McpServerState(row.name, row.first_seen_at, row.seen_at, row.trusted_at, states)


class McpPinStore(StoreBase):
    """The Store's MCP pins."""

    async def mcp_pins(self, server: str) -> dict[str, str] | None:
        """The trusted fingerprints of `server`'s tools; None until its first list is pinned."""
        async with self.transaction() as session:
            row = await session.scalar(select(McpServerRow).where(McpServerRow.name == server))
            if row is None or row.trusted_at is None:
                return None
            tools = await session.scalars(select(McpToolRow).where(
                McpToolRow.server_id == row.id, McpToolRow.pinned.is_not(None)))
            return {t.name: t.pinned for t in tools if t.pinned is not None}

    async def mcp_saw(self, server: str, seen: dict[str, str], notes: dict[str, str]) -> None:
        """Record `server`'s tool list as just listed (name -> fingerprint, name -> preview)."""
        async def op(session: AsyncSession) -> None:
            row = await self._server_row(session, server)
            row.seen_at = self.now()
            tools = await self._tool_rows(session, row)
            for name, fp in seen.items():
                tool = tools.get(name)
                if tool is None:
                    session.add(McpToolRow(server_id=row.id, name=name, seen=fp, note=notes.get(name)))
                else:
                    tool.seen, tool.note = fp, notes.get(name)
            for name, tool in tools.items():
                if name not in seen:
                    tool.seen = None
            await self._forget_unpinned_unseen(session, row)
        await self.retrying(op)

    async def mcp_pin(self, server: str, pins: dict[str, str]) -> None:
        """Make `pins` the trusted fingerprints of `server` (its first list)."""
        async def op(session: AsyncSession) -> None:
            row = await self._server_row(session, server)
            row.trusted_at = self.now()
            tools = await self._tool_rows(session, row)
            for name, fp in pins.items():
                if name in tools:
                    tools[name].pinned = fp
                else:
                    session.add(McpToolRow(server_id=row.id, name=name, pinned=fp))
            for name, tool in tools.items():
                if name not in pins:
                    tool.pinned = None
            await self._forget_unpinned_unseen(session, row)
        await self.retrying(op)

    async def mcp_trust(self, server: str) -> McpServerState:
        """Trust `server`'s tool list as last listed (what `openclaw mcp list` showed, not what the
        server says now): withheld tools are offered from the next look, removed ones forgotten.
        Returns the state before, so the caller can say what it approved."""
        async with self.transaction() as session:
            row = await session.scalar(select(McpServerRow).where(McpServerRow.name == server))
            if row is None:
                raise UnknownMcpServerError(
                    f"no tool list of MCP server {server!r} was seen yet: start the daemon or run "
                    "`openclaw doctor`, which list each server's tools, then trust it")
            tools = await self._tool_rows(session, row)
            before = _state(row, tools.values())
            row.trusted_at = self.now()
            for tool in tools.values():
                tool.pinned = tool.seen
            await self._forget_unpinned_unseen(session, row)
        return before

    async def mcp_server(self, server: str) -> McpServerState | None:
        return next((s for s in await self.mcp_servers() if s.name == server), None)

    async def mcp_servers(self) -> list[McpServerState]:
        """Every server seen, by name, with each tool's trust."""
        async with self.transaction() as session:
            servers = list(await session.scalars(select(McpServerRow).order_by(McpServerRow.name)))
            tools = list(await session.scalars(select(McpToolRow).order_by(McpToolRow.name)))
        return [_state(row, [t for t in tools if t.server_id == row.id]) for row in servers]

    async def _server_row(self, session: AsyncSession, server: str) -> McpServerRow:
        row = await session.scalar(select(McpServerRow).where(McpServerRow.name == server))
        if row is None:
            now = self.now()
            row = McpServerRow(name=server, first_seen_at=now, seen_at=now)
            session.add(row)
            await session.flush()  # a concurrent first sight loses here, and `retrying` reruns
        return row

    @staticmethod
    async def _tool_rows(session: AsyncSession, row: McpServerRow) -> dict[str, McpToolRow]:
        tools = await session.scalars(select(McpToolRow).where(McpToolRow.server_id == row.id))
        return {t.name: t for t in tools}

    @staticmethod
    async def _forget_unpinned_unseen(session: AsyncSession, row: McpServerRow) -> None:
        await session.flush()
        await session.execute(delete(McpToolRow).where(
            McpToolRow.server_id == row.id, McpToolRow.pinned.is_(None), McpToolRow.seen.is_(None)))


class McpPins:
    """The `PinStore` (skills/mcp/trust.py) over the Store, which the daemon hands to the MCP
    skills."""

    def __init__(self, store: McpPinStore) -> None:
        self.store = store

    async def get(self, server: str) -> dict[str, str] | None:
        return await self.store.mcp_pins(server)

    async def put(self, server: str, pins: dict[str, str]) -> None:
        await self.store.mcp_pin(server, pins)

    async def saw(self, server: str, seen: dict[str, str], notes: dict[str, str]) -> None:
        await self.store.mcp_saw(server, seen, notes)
