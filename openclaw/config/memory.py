"""`[memory]`: each user's long-term memory (openclaw/memory.py): whether it is kept, its bounds,
and when and how far consolidation runs. How much of it a prompt reads is `[agent] memory_tokens`."""

from __future__ import annotations

from pydantic import Field

from openclaw.config.fields import Section


class MemoryConfig(Section):
    """`[memory]`: what the agent keeps about each user, and how much."""

    enabled: bool = True
    """Off: nothing is written to any user's memory nor read from it (entries kept stay)."""
    max_entries: int = Field(1000, ge=1)
    """Entries kept per user; past it the oldest unpinned ones are dropped."""
    max_chars: int = Field(500, ge=20)
    """Characters per entry; a longer one is refused with a clear error (a compaction summary is
    cut to it)."""
    recall_entries: int = Field(8, ge=0)
    """Entries found by the words of the new message that a prompt may read (with the pinned
    ones), as `[agent] memory_tokens` allows."""
    consolidate_at: int = Field(200, ge=2)
    """Entries of one scope (a user's private chats, or one group chat) past which a background
    run merges the oldest unpinned ones into summaries."""
    consolidation_tokens: int = Field(4096, ge=256)
    """Hard budget of one consolidation run: prompt and reply tokens of all its model calls."""
