"""Each user's long-term memory in the running daemon: the store's entries within `[memory]`'s
bounds, for the agent (what a turn recalls, compaction's summaries), the `memory` skill and the
chat commands (/remember, /memory). Off for a user (`/memory off`) or for all (`[memory] enabled`),
nothing is written nor read. When a scope grows past `consolidate_at`, a background run merges its
oldest entries (openclaw/memory_consolidation.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from openclaw.config.memory import MemoryConfig
from openclaw.store import Store
from openclaw.store.memory_records import (
    EVERYWHERE,
    MemoryEntry,
    MemoryFull,
    MemoryKind,
    chat_scope,
    visible_scopes,
)

log = logging.getLogger(__name__)

# Runs one scope's consolidation: (user, scope) -> awaitable; set by the daemon when a model is up.
Consolidate = Callable[[str, str], Any]


class Memory:
    def __init__(self, store: Store, config: MemoryConfig,
                 consolidate: Consolidate | None = None) -> None:
        self.store, self.config, self.consolidate = store, config, consolidate
        self._running: dict[tuple[str, str], asyncio.Task] = {}  # consolidations, one per scope
        # Whether each user's memory is on, as the store says: read at every turn, changed only
        # by /memory off|on here (the daemon is the store's only writer while it runs).
        self._on: dict[str, bool] = {}
        # Users known to have no entry at all, whose turns then recall nothing without asking the
        # store (most users, most turns); `keep`, the one way in for an entry, takes them off
        # before it stores one. Counted once per user: one found to have entries is not counted
        # again. `_kept` numbers each user's keeps, so a count that raced one is not believed.
        self._none: set[str] = set()
        self._counted: set[str] = set()
        self._kept: dict[str, int] = {}

    async def enabled(self, user: str) -> bool:
        if not self.config.enabled:
            return False
        if (on := self._on.get(user)) is None:
            on = self._on[user] = await self.store.memory_enabled(user)
        return on

    async def set_enabled(self, user: str, on: bool) -> None:
        """/memory on|off."""
        self._on.pop(user, None)
        await self.store.set_memory_enabled(user, on)
        self._on[user] = on

    # -- for the agent (agent.memory.MemorySource) ------------------------------------------------

    def holds_nothing(self, user: str) -> bool:
        return not self.config.enabled or self._on.get(user) is False or user in self._none

    async def recall(self, user: str, scope: str, query: str) -> list[MemoryEntry]:
        if not await self.enabled(user) or user in self._none:
            return []
        found = await self.store.recall(user, visible_scopes(scope), query,
                                        limit=self.config.recall_entries)
        if not found and user not in self._counted:
            self._counted.add(user)
            kept = self._kept.get(user, 0)
            if not await self.store.count_memories(user) and self._kept.get(user, 0) == kept:
                self._none.add(user)
        return found

    async def remember_summary(self, user: str, scope: str, text: str, source: str) -> None:
        """A compaction's summary, cut to `max_chars` (the conversation keeps it whole)."""
        text = text.strip()
        if len(text) > self.config.max_chars:
            text = text[:self.config.max_chars - 1] + "…"
        try:
            await self.keep(user, scope, text, kind=MemoryKind.SUMMARY, source=source)
        except (ValueError, MemoryFull) as exc:  # the summary stays in its conversation
            log.warning("a summary of %s's conversation was not kept in their memory: %s", user, exc)

    # -- for the skill and the commands (skills.base.MemoryBook) ------------------------------------

    async def remember(self, user: str, chat_id: str, in_group: bool, text: str, *,
                       kind: str = MemoryKind.FACT, pinned: bool = False,
                       everywhere: bool = False, source: str | None = None
                       ) -> tuple[MemoryEntry, bool] | None:
        scope = EVERYWHERE if everywhere else chat_scope(chat_id, in_group)
        try:
            return await self.keep(user, scope, text, kind=MemoryKind(kind), source=source,
                                   pinned=pinned)
        except MemoryFull as exc:
            raise ValueError(str(exc)) from None

    async def search(self, user: str, chat_id: str, in_group: bool,
                     query: str) -> list[MemoryEntry] | None:
        if not await self.enabled(user):
            return None
        return await self.store.search_memories(user, visible_scopes(chat_scope(chat_id, in_group)),
                                                query, limit=self.config.recall_entries or 8)

    async def entries(self, user: str, chat_id: str, in_group: bool) -> list[MemoryEntry] | None:
        """What /memory lists: the entries this chat reads (not those of the user's other chats:
        a group sees none of their private ones). Listed also while memory is off."""
        return await self.store.list_memories(user, visible_scopes(chat_scope(chat_id, in_group)))

    async def forget(self, user: str, chat_id: str, in_group: bool, number: int) -> MemoryEntry | None:
        return await self.store.forget_memory(user, number,
                                              visible_scopes(chat_scope(chat_id, in_group)))

    # -- inside -------------------------------------------------------------------------------

    async def keep(self, user: str, scope: str, text: str, *, kind: MemoryKind,
                   source: str | None = None, pinned: bool = False) -> tuple[MemoryEntry, bool] | None:
        """Store an entry within the bounds; None when memory is off for the user."""
        if not await self.enabled(user):
            return None
        self._kept[user] = self._kept.get(user, 0) + 1  # before it is stored: see recall
        self._none.discard(user)
        kept = await self.store.add_memory(user, scope, text, kind=kind, source=source,
                                           pinned=pinned, max_entries=self.config.max_entries,
                                           max_chars=self.config.max_chars)
        if kept[1]:
            await self._maybe_consolidate(user, scope)
        return kept

    async def _maybe_consolidate(self, user: str, scope: str) -> None:
        if self.consolidate is None or (user, scope) in self._running:
            return
        if await self.store.count_memories(user, [scope]) <= self.config.consolidate_at:
            return
        task = asyncio.create_task(self._consolidate(user, scope), name=f"memory {user} {scope}")
        self._running[(user, scope)] = task

    async def _consolidate(self, user: str, scope: str) -> None:
        try:
            await self.consolidate(user, scope)
        except asyncio.CancelledError:
            raise
        except Exception:  # the entries stay as they were: replaced only when a run completes
            log.exception("consolidating %s's memory (%s) failed", user, scope)
        finally:
            self._running.pop((user, scope), None)

    async def consolidated(self) -> None:
        """Wait for the consolidations running now to end."""
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the consolidations running: what they did not commit is not changed."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
