"""What the store hands back of a user's long-term memory: the entries' kinds, the frozen entry,
and the scopes an entry lives in (a user's private chats, one group chat, or everywhere)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class MemoryKind(StrEnum):
    FACT = "fact"
    PREFERENCE = "preference"
    INSTRUCTION = "instruction"  # a standing instruction ("answer in French")
    SUMMARY = "summary"  # of an earlier conversation (compaction) or of older entries


# An entry is read only in the chats of its scope. Private chats share one scope; each group chat
# has its own; "everywhere" is the user's explicit choice (/remember --everywhere).
PRIVATE = "private"
EVERYWHERE = "everywhere"


def chat_scope(chat_id: str | int, is_group: bool) -> str:
    """The scope an entry written in this chat gets."""
    return f"group:{chat_id}" if is_group else PRIVATE


def visible_scopes(scope: str) -> tuple[str, str]:
    """The scopes read in a chat of `scope`: its own, and the user's "everywhere" entries."""
    return (scope, EVERYWHERE)


class MemoryFull(Exception):
    """Every entry the user keeps is pinned and the limit is reached: nothing was stored."""


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    id: int  # internal; consolidation replaces entries by id
    number: int  # what its user sees and types (/memory forget N): per user, never reused
    user: str
    scope: str
    kind: MemoryKind
    text: str
    source: str | None  # "message:ID", "summary:ID", "user" (typed), "consolidated:ID,ID,..."
    pinned: bool
    created_at: datetime
