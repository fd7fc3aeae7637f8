"""The user's memory in the prompt: what the agent needs of it (`MemorySource`), and the message
that carries it, filled within its token budget as the model counts (ChatModel.count_chat).

The message goes just before the turn's user message: after the system prompt, whose prefix the
engine's cache keeps serving, and after the earlier history too, which changes no more than the
system prompt does, so a turn's memory never costs the cache the history before it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

MEMORY_HEADER = ("The user's memory (notes kept across conversations: what they told you or "
                 "asked you to remember; they see them with /memory):")


class MemorySource(Protocol):
    """Where a turn's memory comes from and where compaction's summaries go (openclaw.memory)."""

    async def recall(self, user: str, scope: str, query: str) -> list[Any]:
        """Entries (with `text`, `kind`) for the prompt, most wanted first: pinned, then relevant
        to `query`; none when the user's memory is off."""

    async def remember_summary(self, user: str, scope: str, text: str, source: str) -> None:
        """Keep a compaction's summary as an entry (nothing when the user's memory is off)."""

    def holds_nothing(self, user: str) -> bool:
        """Whether `recall` is known, without asking the store, to find nothing for `user` (their
        memory off, or empty): the turn then asks none (no store call for it)."""


def entry_line(entry: Any) -> str:
    return f"- ({entry.kind}) {entry.text}"


def memory_message(lines: list[str]) -> dict:
    return {"role": "system", "content": MEMORY_HEADER + "\n" + "\n".join(lines)}


async def fitted(lines: list[str], budget: int, count: Callable[[dict], Awaitable[int]],
                 bound: Callable[[dict], int | None] | None = None) -> dict | None:
    """The memory message with as many of `lines` (in their order) as fit in `budget` tokens,
    the message counted alone as the model counts it (`count`, of the message alone); None when
    not even one fits. All of them without a count where `bound` (at least the count, taken
    without encoding) fits already (the usual case); else one count, then a binary search
    (lines only add tokens)."""
    if not lines or budget <= 0:
        return None
    message = memory_message(lines)
    if bound is not None and (at_most := bound(message)) is not None and at_most <= budget:
        return message
    if await count(message) <= budget:
        return message
    fits, over = 0, len(lines)  # the most lines known to fit, the fewest known not to
    while over - fits > 1:
        middle = (fits + over) // 2
        if await count(memory_message(lines[:middle])) <= budget:
            fits = middle
        else:
            over = middle
    return memory_message(lines[:fits]) if fits else None


def with_memory(prompt: list[dict], memory: dict | None) -> list[dict]:
    """`prompt` with the memory message before its last user message (see the module's note)."""
    if memory is None:
        return prompt
    # From the end: the last user message is near it, and a long history is not walked.
    last_user = next((i for i in range(len(prompt) - 1, -1, -1) if prompt[i]["role"] == "user"),
                     len(prompt))
    return [*prompt[:last_user], memory, *prompt[last_user:]]
