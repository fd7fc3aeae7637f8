"""What every connector provides, and what they share: chunking replies to a channel's limit.

A connector translates between its library's objects and InboundMessage / outbound text, and
nothing else: access, storage and the agent live in `openclaw/`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from openclaw.gateway_types import InboundMessage

Handler = Callable[[InboundMessage], Awaitable[None]]


class ConnectorStartError(Exception):
    """A connector cannot start for a reason the admin must fix (a rejected token): the daemon
    stops with this message instead of a traceback."""


class DeliveryRefused(Exception):
    """The service refused a message for good (the user blocked the bot, the chat is gone, the text
    is invalid): the gateway marks it failed instead of retrying. Any other exception from
    send_text means "try again later"."""


class Connector(Protocol):
    name: str  # the channel: "terminal", "telegram", "discord"
    max_message_len: int

    async def start(self, handler: Handler) -> None:
        """Begin receiving; call `handler` for each message (it returns once the message is stored)."""

    async def stop(self) -> None: ...

    async def send_text(self, chat_id: str, text: str) -> str | None:
        """Send one message (already within max_message_len); return its id if the app has one.
        Raise on failure: the gateway keeps the message and retries it later. If a streamed draft
        is open in this chat, the first send of the reply replaces the draft's text instead."""

    async def typing(self, chat_id: str) -> None: ...

    async def edit_text(self, chat_id: str, message_id: str, text: str) -> None: ...

    # Optional: `async def fetch_attachment(self, ref, folder) -> (file name | None, note | None)`
    # saves one of InboundMessage.attachments into `folder` (the user's workspace), or says why not.
    # Optional: `async def draft(self, chat_id, text)` shows a reply while it is generated (the
    # whole text so far each call; the connector rate-limits its edits). Only called when the
    # channel's `stream_edits` is on.


def chunk_text(text: str, limit: int) -> list[str]:
    """Split `text` into pieces of at most `limit` characters, preferring paragraph, then line,
    then word boundaries. A piece that ends inside a ``` code fence closes it, and the next piece
    reopens it (with the same info string), so each message renders on its own."""
    if limit < 16:
        raise ValueError("chunk limit must be at least 16 characters")
    pieces: list[str] = []
    rest = text
    reopen = ""
    while rest:
        rest = reopen + rest
        if len(rest) <= limit:
            pieces.append(rest)
            break
        budget = limit - 4  # room for a closing "\n```"
        cut = _best_cut(rest, budget)
        piece, rest = rest[:cut], rest[cut:].lstrip("\n")
        fence = _open_fence(piece)
        if fence is not None:
            piece = piece.rstrip("\n") + "\n```"
            reopen = fence + "\n"
        else:
            reopen = ""
        pieces.append(piece.rstrip())
    return [p for p in pieces if p.strip()]


def _best_cut(text: str, budget: int) -> int:
    window = text[:budget]
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > budget // 4:  # never a tiny first piece just to hit a boundary
            return at + len(sep)
    return budget


def _open_fence(piece: str) -> str | None:
    """The opening fence line (e.g. "```python") if `piece` ends inside a code block."""
    fence = None
    for line in piece.split("\n"):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped
    return fence
