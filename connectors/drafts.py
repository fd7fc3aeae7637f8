"""Streamed drafts: a reply shown while it is generated, in one message per chat that is sent and
then edited at most once per interval (the latest text wins), in the background so generation
never waits on the network. The reply's first send turns that message into the reply.

The connector gives the service calls (send a message, edit one) and says which errors mean a
rate limit or a message gone; the rest is the same for every channel."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A draft nothing updated for this long is forgotten (its message stays as it is): a turn that ends
# with no reply (its user shut out mid-answer) would otherwise leave its draft here for ever. Longer
# than a turn waits between two pieces of its answer; a draft forgotten all the same only means
# that its reply comes as a new message.
DRAFT_IDLE_S = 3600.0

Send = Callable[[str, str], Awaitable[int]]  # (chat id, text) -> the new message's id
Edit = Callable[[str, int, str], Awaitable[object]]  # (chat id, message id, text)


@dataclass
class _Draft:
    """A reply being streamed into one message of a chat."""

    text: str = ""  # the latest text the reply has reached
    shown: str = ""  # what the draft message shows
    message_id: int | None = None
    last_edit: float = float("-inf")  # loop time of the last send or edit
    task: asyncio.Task | None = None
    in_flight: bool = False  # a send or edit is on the wire: its result (the id) is needed
    closed: bool = False
    failed: bool = False  # the service refused an update: this reply's draft shows no more
    touched: float = float("-inf")  # loop time of the latest update

    def busy(self) -> bool:
        return self.in_flight or (self.task is not None and not self.task.done())


class DraftStream:
    """The drafts of one connector, one per chat. `send` and `edit` show a draft; `limit` is the
    service's message length (a longer draft shows its start); `interval` the least time between
    two of a draft's sends or edits. `retry_after(exc)`: the seconds a rate limit asks to wait, or
    None for any other error (the draft then stops: it is cosmetic, the reply still comes).
    `message_gone(exc)`: an edit failed because the draft's message no longer exists (deleted
    meanwhile). `retried(exc)`: the send that failed with `exc` will be tried again (so the draft
    is kept for it to edit); False for a refusal for good. `why(exc)` words an error for the log."""

    def __init__(self, channel: str, *, send: Send, edit: Edit, limit: int, interval: float,
                 message_gone: Callable[[Exception], bool],
                 retried: Callable[[Exception], bool] = lambda exc: True,
                 retry_after: Callable[[Exception], float | None] = lambda exc: None,
                 why: Callable[[BaseException], str] = str) -> None:
        self.channel, self._send, self._edit = channel, send, edit
        self.limit, self.interval = limit, interval
        self._message_gone, self._retried = message_gone, retried
        self._retry_after, self._why = retry_after, why
        self._drafts: dict[str, _Draft] = {}
        self._swept = float("-inf")  # loop time of the last look for forgotten drafts

    def __len__(self) -> int:
        """How many drafts are kept (of chats active lately)."""
        return len(self._drafts)

    def update(self, chat_id: str, text: str) -> None:
        """Show the reply so far (the whole text each call): the first update sends a message,
        later ones edit it. Never waits for the network."""
        text = _fit(text, self.limit)
        if not text:
            return
        now = asyncio.get_running_loop().time()
        self._forget_idle(now)
        draft = self._drafts.setdefault(chat_id, _Draft())
        draft.touched = now
        if draft.failed:
            return
        draft.text = text
        if draft.task is None or draft.task.done():
            draft.task = asyncio.create_task(self._show(chat_id, draft), name=f"{self.channel} draft")

    async def replace(self, chat_id: str, edit: Callable[[int], Awaitable[object]]) -> str | None:
        """For the first send of a reply: end the chat's draft and have `edit(message_id)` turn
        its message into the reply; that message's id, or None when there is no draft message (none
        was sent, or it is gone) and the caller sends the reply anew. Any other error is raised,
        with the draft kept when the send is retried, so the retry edits it instead of adding a
        second message (kept after a refusal for good, it would swallow the chat's next draft)."""
        draft = await self._close(chat_id)
        if draft is None or draft.message_id is None:
            return None
        try:
            await edit(draft.message_id)
        except Exception as exc:
            if not self._message_gone(exc):
                if self._retried(exc):
                    self._drafts.setdefault(chat_id, draft)
                raise
            log.info("%s: could not turn the draft into the reply (%s); sending it anew",
                     self.channel, self._why(exc))
            return None
        return str(draft.message_id)

    def drop(self, chat_id: str) -> None:
        """Leave the chat's draft as it shows; its next draft starts a new message."""
        draft = self._drafts.pop(chat_id, None)
        if draft is not None:
            draft.closed = True
            if draft.task is not None:
                draft.task.cancel()

    async def close(self, wait_s: float | None = None) -> None:
        """End every draft (at the connector's stop). A send or edit on the wire is waited for
        up to `wait_s` (None: until it ends), then cancelled: a library that sleeps out a rate
        limit inside the request must not hold up the stop."""
        drafts = [self._drafts.pop(chat_id) for chat_id in list(self._drafts)]
        for draft in drafts:
            draft.closed = True
        tasks = [d.task for d in drafts if d.task is not None and not d.task.done()]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=wait_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _forget_idle(self, now: float) -> None:
        """Drop the drafts nothing updated for DRAFT_IDLE_S, looking a few times per DRAFT_IDLE_S:
        only the drafts of chats active lately are kept."""
        if now - self._swept < DRAFT_IDLE_S / 4:
            return
        self._swept = now
        for chat_id, draft in list(self._drafts.items()):
            if now - draft.touched > DRAFT_IDLE_S and not draft.busy():
                del self._drafts[chat_id]

    async def _show(self, chat_id: str, draft: _Draft) -> None:
        loop = asyncio.get_running_loop()
        while not draft.closed and draft.text != draft.shown:
            wait = draft.last_edit + self.interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            text = draft.text
            draft.in_flight = True
            try:
                if draft.message_id is None:
                    draft.message_id = await self._send(chat_id, text)
                else:
                    await self._edit(chat_id, draft.message_id, text)
            except Exception as exc:
                seconds = self._retry_after(exc)
                if seconds is not None:  # the next try waits as long as the service asked
                    draft.last_edit = loop.time() + seconds - self.interval
                    continue
                log.debug("%s: draft update failed: %s", self.channel, self._why(exc))
                draft.failed = True
                return
            finally:
                draft.in_flight = False
            draft.shown, draft.last_edit = text, loop.time()

    async def _close(self, chat_id: str) -> _Draft | None:
        """Stop updating the chat's draft; wait for a send on the wire, whose message id we need."""
        draft = self._drafts.pop(chat_id, None)
        if draft is None:
            return None
        draft.closed = True
        if draft.task is not None and not draft.task.done():
            if not draft.in_flight:
                draft.task.cancel()
            await asyncio.gather(draft.task, return_exceptions=True)
        return draft


def _fit(text: str, limit: int) -> str:
    """The draft as one message shows it: without trailing whitespace (Telegram trims it, so an
    edit adding only a space would be refused as "not modified"), and cut to `limit` (the reply's
    chunks replace it)."""
    text = text.rstrip()
    return text if len(text) <= limit else text[:limit - 1] + "…"
