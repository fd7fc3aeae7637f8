"""Strangers let in: each approved pairing code is taken up once (Store.take_welcomes), wherever
it was approved (the owner's /pairing in chat, `openclaw pairing approve` in another process, or
while the daemon was down): the stranger is told they are in, in the chat they asked from, and
the message they asked with is answered then, as their first turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from openclaw.gateway.contract import InboundMessage
from openclaw.gateway.outbox import Outbox
from openclaw.store import Store
from openclaw.store.records import InboundEvent

log = logging.getLogger(__name__)

# How often the store is looked at for approvals made by another process (`openclaw pairing
# approve`); one made in chat is taken up at once.
POLL_S = 5.0


def greeting(kept: bool) -> str:
    return ("Welcome! The owner approved your request: you can talk to me now."
            + (" Here is my answer to your first message." if kept else ""))


def inbound_message(event: InboundEvent) -> InboundMessage:
    """The message a stored inbound event holds, as its connector handed it in."""
    channel, _, user_id = event.user.partition(":")
    payload = event.payload or {}
    return InboundMessage(channel, user_id, event.chat_id, event.message_id, event.text,
                          display_name=payload.get("display_name"),
                          attachments=payload.get("attachments") or [],
                          notice=payload.get("notice"),
                          # What a group may see (/status, /pairing, drafts) stays so.
                          is_group=bool(payload.get("is_group")))


class Welcomes:
    """`answer(msg, event)` answers a taken-up message as the gateway answers any admitted one."""

    def __init__(self, store: Store, outbox: Outbox,
                 answer: Callable[[InboundMessage, InboundEvent], Awaitable[None]],
                 poll_s: float = POLL_S) -> None:
        self.store, self.outbox, self.answer, self.poll_s = store, outbox, answer, poll_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="pairing welcomes")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def wake(self) -> None:
        """A code was approved here: take it up now, not at the next poll."""
        self._wake.set()

    async def take_up(self) -> int:
        """Welcome everyone approved since the last look; how many."""
        welcomes = await self.store.take_welcomes(greeting)
        for welcome in welcomes:
            self.outbox.redeliver(welcome.channel, welcome.chat_id)
            if welcome.event is not None:
                await self.answer(inbound_message(welcome.event), welcome.event)
        return len(welcomes)

    async def _follow(self) -> None:
        while True:
            try:
                await self.take_up()
            except Exception:  # the store away a moment: the next look tries again
                log.exception("taking up approved pairing requests failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._wake.wait()
            self._wake.clear()
