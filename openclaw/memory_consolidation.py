"""Consolidation of one user's memory in one scope: the oldest unpinned entries merged by the model
into fewer notes, in the background (the engine runs a user's turn first), within a hard token
budget per run.

Nothing is rewritten in place and nothing is written until the run completes: the new notes and
the removal of the entries they replace are one transaction at the end (Store.replace_memories),
so a crash, a kill -9 or a cancel before it leaves every entry as it was, and pinned entries are
never among those replaced. A reply that is not a list of shorter notes replaces nothing.
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from dataclasses import dataclass

from engine import SamplingParams
from openclaw.agent.model import ChatModel
from openclaw.config.memory import MemoryConfig
from openclaw.store import Store
from openclaw.store.memory_records import MemoryEntry, MemoryKind

log = logging.getLogger(__name__)

BACKGROUND_PRIORITY = 10  # the engine runs lower numbers first: every turn (0) goes before
GROUP = 20  # entries merged by one model call, at most
INSTRUCTIONS = (
    "You keep an assistant's notes about one user. Merge the notes below into fewer, shorter "
    "notes: one per line, each starting with '- '. Keep every name, fact, number, preference and "
    "instruction; drop only repeats. Write only the notes.")


@dataclass
class Consolidated:
    replaced: int = 0  # entries replaced
    made: int = 0  # notes made
    spent: int = 0  # prompt and reply tokens of the run's model calls


class Consolidation:
    def __init__(self, store: Store, model: ChatModel, config: MemoryConfig) -> None:
        self.store, self.model, self.config = store, model, config

    async def run(self, user: str, scope: str) -> Consolidated:
        """Merge the oldest unpinned entries of `user` in `scope`, down to half the threshold,
        spending at most `consolidation_tokens`."""
        done = Consolidated()
        entries = [e for e in await self.store.list_memories(user, [scope]) if not e.pinned]
        excess = len(entries) - self.config.consolidate_at // 2
        old = entries[:max(excess, 0)]
        merged: list[tuple[list[MemoryEntry], list[str]]] = []
        while len(old) >= 2:
            left = self.config.consolidation_tokens - done.spent
            reply_tokens = min(left // 2, 64 * GROUP)
            group = old[:GROUP]
            while len(group) >= 2 and await self._count(group) + reply_tokens > left:
                group = group[:len(group) // 2]
            if len(group) < 2 or reply_tokens < 1:  # the budget is spent
                break
            old = old[len(group):]
            reply, spent = await self._merge(user, group, reply_tokens)
            done.spent += spent
            if (notes := self._notes(reply, len(group))) is not None:
                merged.append((group, notes))
        if merged:  # one transaction: the old entries go only with the new ones stored
            made = await self.store.replace_memories(
                user, [e.id for group, _ in merged for e in group],
                [(scope, note, MemoryKind.SUMMARY,
                  "consolidated:" + ",".join(str(e.id) for e in group))
                 for group, notes in merged for note in notes])
            done.replaced, done.made = sum(len(g) for g, _ in merged), len(made)
        log.info("memory of %s (%s): %d entries merged into %d notes, %d tokens", user, scope,
                 done.replaced, done.made, done.spent)
        return done

    def _prompt(self, group: list[MemoryEntry]) -> list[dict]:
        return [{"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": "\n".join(f"- {e.text}" for e in group)}]

    async def _count(self, group: list[MemoryEntry]) -> int:
        return await self.model.count_chat(self._prompt(group))

    async def _merge(self, user: str, group: list[MemoryEntry], reply_tokens: int) -> tuple[str, int]:
        """The model's reply, cut at `reply_tokens` whatever the backend does with max_tokens,
        and the tokens it spent."""
        params = SamplingParams(temperature=0.0, max_tokens=reply_tokens)
        last = None
        async with aclosing(self.model.generate(self._prompt(group), params,
                                                priority=BACKGROUND_PRIORITY,
                                                cache_salt=user)) as stream:
            async for out in stream:
                last = out
                if out.completion_tokens >= reply_tokens:
                    break
        if last is None:
            return "", 0
        return last.text, last.prompt_tokens + min(last.completion_tokens, reply_tokens)

    def _notes(self, reply: str, replacing: int) -> list[str] | None:
        """The notes of a reply, or None when it is no merge: no notes, as many as it replaces,
        or one longer than an entry may be."""
        notes = [line.strip().removeprefix("- ").strip() for line in reply.splitlines()]
        notes = [n for n in notes if n]
        if not notes or len(notes) >= replacing or any(len(n) > self.config.max_chars for n in notes):
            return None
        return notes
