"""Ordered, retried delivery of replies, and `chunk_text`, which cuts a reply to a channel's limit.

A reply's pieces are stored as `pending` (in the same
transaction that marks the message they answer as processed) before anything is sent; a send that
fails stays pending and is retried with backoff, in order per chat, until the service takes it (or
it is too old to matter). At start-up what an earlier run left pending is sent too: a rare
duplicate after a crash beats a lost reply.

One chat's deliveries never overlap: every send and every retry of a chat holds that chat's lock,
so a piece is never sent twice by two senders and never overtakes an earlier one. A chat's lock
lives only while a sender holds it or waits for it: chats written to once (a stranger's pairing
code) leave nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import weakref
from collections.abc import Awaitable, Callable
from datetime import timedelta

from openclaw.gateway.contract import Connector, DeliveryRefused, RetryLater
from openclaw.metrics import Metrics
from openclaw.store import Store
from openclaw.store.records import InboundEvent, InboundStatus, OutboundMessage, OutboundStatus
from sandbox.to_end import run_to_end

log = logging.getLogger(__name__)

ChatKey = tuple[str, str]  # (channel, chat_id)
# Told when a chat refuses everything from the bot for good, or moved: (channel, chat_id, refusal).
# For a move it is expected to re-point the chat's pending replies to the new id and call
# `redeliver` for it (the gateway's move does both); if it raises, the refused reply is failed.
ChatRefused = Callable[[str, str, DeliveryRefused], Awaitable[None]]


class Outbox:
    def __init__(self, store: Store, connectors: dict[str, Connector], metrics: Metrics | None = None, *,
                 first_delay_s: float = 1.0, max_delay_s: float = 60.0, max_age_s: float = 24 * 3600) -> None:
        self.store, self.connectors = store, connectors
        self.metrics = metrics or Metrics()
        self.first_delay_s, self.max_delay_s, self.max_age_s = first_delay_s, max_delay_s, max_age_s
        # Weak: whoever holds a lock or waits for it keeps it (and its entry) alive; a lock nobody
        # needs goes, and the next sender to the chat makes a new one.
        self._locks: weakref.WeakValueDictionary[ChatKey, asyncio.Lock] = weakref.WeakValueDictionary()
        self._retrying: dict[ChatKey, asyncio.Task] = {}
        self._wake: dict[ChatKey, asyncio.Event] = {}  # ends a retry's wait before its next try
        self._closed = False
        self._following: asyncio.Task | None = None  # see follow_connections
        self.on_chat_refused: ChatRefused | None = None
        # Retries run in the context the outbox was made in, not in that of the message whose
        # send happened to start one: a connector may keep per-message state there (Discord: the
        # slash command a send answers), which a later retry of other replies must not inherit.
        self._context = contextvars.copy_context()

    async def send(self, channel: str, chat_id: str, pieces: list[str], *, conversation_id: int | None,
                   answers: int | None, kept: list[OutboundMessage] | None = None) -> None:
        """Store the pieces (marking the inbound event they answer processed), then send them in
        order. Returns when they are sent, or queued for retry behind an earlier failure. `kept`
        gets the stored pieces, also when this is cancelled (for `give_up`)."""
        storing = self.store.add_reply(channel, chat_id, pieces, conversation_id=conversation_id,
                                       answers=answers)
        try:
            # A store call ends whole before its caller gets a cancel; run_to_end only to hand
            # `kept` its result then (a task more, for those that ask).
            stored = await (storing if kept is None else run_to_end(storing, kept.extend))
        except asyncio.CancelledError:
            # Cancelled (/stop, shutdown) while the pieces were stored: that ran to its end
            # first, so the reply is stored, pending, and the message it answers marked
            # processed. A retry sends it; left waiting, it went out only at the next start.
            self._start_retry((channel, chat_id))
            raise
        if kept is not None:
            kept.extend(stored)
        await self.deliver(channel, chat_id, stored)

    async def reply(self, channel: str, chat_id: str, text: str, *, conversation_id: int | None,
                    event: InboundEvent | None, kept: list[OutboundMessage] | None = None) -> None:
        """`text` chunked to the channel's limit, then `send`. With `event`, storing the reply also
        marks that message processed (or failed, when the channel has no connector here)."""
        connector = self.connectors.get(channel)
        if connector is None:
            log.warning("no %s connector to deliver a reply", channel)
            if event is not None:
                await self.store.mark_inbound(event.id, InboundStatus.FAILED, "connector not running")
            return
        await self.send(channel, chat_id, chunk_text(text, connector.max_message_len),
                        conversation_id=conversation_id, answers=event.id if event else None,
                        kept=kept)

    async def give_up(self, pieces: list[OutboundMessage], why: str) -> None:
        """Send none of `pieces` that is not out yet: they lost their meaning (a request to approve
        whose wait ended). One being sent right now still goes."""
        if pieces:
            await self.store.fail_unsent([piece.id for piece in pieces], why)

    async def deliver(self, channel: str, chat_id: str, stored: list[OutboundMessage]) -> None:
        """Send pieces already stored as pending (`send` stores them; a fired reminder's are
        stored with its delivery record), in order behind anything still pending in the chat."""
        key = (channel, chat_id)
        async with self._lock(key):
            if key in self._retrying:  # an earlier reply is still waiting: it goes first
                return
            try:
                wait = await self._deliver(stored)
            except BaseException:  # cancelled mid-send (/stop, shutdown): what is left is retried
                self._start_retry(key)
                raise
            if wait is not None:
                self._start_retry(key, after=wait)

    async def recover(self) -> int:
        """Send what an earlier run left pending (it stopped or crashed before the service took it)."""
        keys = {(o.channel, o.chat_id) for o in await self.store.pending_outbound()}
        for key in keys:
            self._start_retry(key, immediately=True)
        return len(keys)

    def redeliver(self, channel: str, chat_id: str) -> None:
        """Send what is pending for this chat now, in order: replies were moved to it (the chat
        changed its id). Behind a send already under way to it; nothing when none are pending."""
        self._start_retry((channel, chat_id), immediately=True)
        self.retry_now(channel, chat_id)  # a retry already waiting out its backoff goes now

    def follow_connections(self, every_s: float = 1.0,
                           on_back: Callable[[str], None] | None = None) -> None:
        """From now until close(), when a connector comes back after an outage (its `connected`
        turns true again), its chats' waiting replies go at once, not at the end of a backoff that
        may have grown to max_delay_s while it was away; `on_back(channel)` is told too."""
        async def follow() -> None:
            was: dict[str, bool] = {}
            while True:
                for name, connector in list(self.connectors.items()):
                    up = bool(connector.connected)
                    if up and was.get(name) is False:
                        self.retry_channel_now(name)
                        if on_back is not None:
                            on_back(name)
                    was[name] = up
                await asyncio.sleep(every_s)

        if self._following is None and not self._closed:
            self._following = asyncio.create_task(follow(), name="outbox follows connections",
                                                  context=self._context.copy())

    def retry_channel_now(self, channel: str) -> None:
        """Try the waiting replies of every chat of `channel` at once: its connector is up now (at
        start, what an earlier run left was tried before it was, and failed into the backoff)."""
        for (waiting_channel, chat_id) in list(self._wake):
            if waiting_channel == channel:
                self.retry_now(channel, chat_id)

    def retry_now(self, channel: str, chat_id: str) -> None:
        """Try a chat's waiting replies at once rather than after the backoff, because it is
        reachable again (a console attached). Nothing when none wait."""
        if (wake := self._wake.get((channel, chat_id))) is not None:
            wake.set()

    async def settled(self, channel: str, chat_id: str) -> None:
        """Until nothing waits for a retry in this chat (sent, or given up, or the outbox closed)."""
        while (task := self._retrying.get((channel, chat_id))) is not None:
            await asyncio.wait({task})  # neither cancels it nor passes its cancellation on

    @property
    def backlog(self) -> int:
        """Chats with replies waiting for a retry."""
        return len(self._retrying)

    async def wait_delivered(self) -> None:
        while self._retrying:
            await asyncio.gather(*self._retrying.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop retrying; what is still pending stays pending for the next start."""
        self._closed = True  # a send still in flight must not start a retry after this
        tasks = list(self._retrying.values()) + ([self._following] if self._following else [])
        self._retrying.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _lock(self, key: ChatKey) -> asyncio.Lock:
        """The chat's lock. The caller must keep it until released (`async with self._lock(key)`
        does): a lock nobody refers to is dropped from `_locks`."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _start_retry(self, key: ChatKey, immediately: bool = False, after: float = 0.0) -> None:
        """Retry the chat's pending replies in the background: at once, or after the backoff's
        first delay (at least `after`, what the service asked to wait)."""
        if key not in self._retrying and not self._closed:
            self._wake[key] = asyncio.Event()  # from now on retry_now reaches this retry
            self._retrying[key] = asyncio.create_task(self._retry(key, immediately, after),
                                                      name=f"outbox {key}",
                                                      context=self._context.copy())

    async def _pause(self, key: ChatKey, seconds: float, at_least: float = 0.0) -> None:
        """Wait `seconds`, or less if woken (retry_now, redeliver), but never less than
        `at_least`: what the service asked (a rate limit) is not hurried by a wake, which would
        only meet another 429 and double the backoff."""
        loop = asyncio.get_running_loop()
        earliest = loop.time() + at_least
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancel that arrives as
        # the event is set (retry_now, then close), and this retry would go on forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake[key].wait()
        if (left := earliest - loop.time()) > 0:
            await asyncio.sleep(left)

    async def _retry(self, key: ChatKey, immediately: bool, after: float = 0.0) -> None:
        delay = self.first_delay_s
        try:
            if not immediately:
                await self._pause(key, max(_jitter(delay), after), at_least=after)
            while True:
                async with self._lock(key):
                    self._wake[key].clear()  # a wake from now on asks for another attempt
                    pending = [o for o in await self.store.pending_outbound(*key)
                               if not await self._expired(o)]
                    if not pending:
                        # Under the lock: a send waiting for it now sees no retry and sends itself.
                        self._retrying.pop(key, None)
                        self._wake.pop(key, None)
                        return
                    wait = await self._deliver(pending)
                if wait is not None:
                    delay = min(delay * 2, self.max_delay_s)
                    await self._pause(key, max(_jitter(delay), wait), at_least=wait)
        except asyncio.CancelledError:
            raise
        except Exception:  # e.g. the database went away: log it; the next start resends
            log.exception("retrying replies to %s:%s failed; they stay pending", *key)
            self._retrying.pop(key, None)
            self._wake.pop(key, None)

    async def _expired(self, item: OutboundMessage) -> bool:
        if self.store.now() - item.created_at < timedelta(seconds=self.max_age_s):
            return False
        log.warning("giving up on reply %d to %s:%s after %d attempts", item.id, item.channel,
                    item.chat_id, item.attempts)
        await self.store.mark_outbound(item.id, OutboundStatus.FAILED, error=f"undelivered for "
                                       f"{self.max_age_s:.0f} s: {item.error}")
        return True

    async def _deliver(self, items: list[OutboundMessage]) -> float | None:
        """Send in order. None: all done; at the first failure, how long the service asked to
        wait before the next try (0: it did not say), leaving that one and the rest pending."""
        for item in items:
            connector = self.connectors.get(item.channel)
            if connector is None:
                await self.store.mark_outbound(item.id, OutboundStatus.FAILED,
                                               error=f"no {item.channel} connector is running")
                continue
            try:
                external_id = await connector.send_text(item.chat_id, item.text)
            except DeliveryRefused as exc:  # blocked by the user, chat gone: retrying cannot help
                log.warning("%s refused a reply to %s: %s", item.channel, item.chat_id, exc)
                if exc.moved_to and await self._tell(item, exc):
                    # This reply and the rest of `items` are pending under the new id now, and
                    # sent from there: nothing is left here.
                    return None
                await self.store.mark_outbound(item.id, OutboundStatus.FAILED, error=str(exc))
                if exc.chat_gone:
                    await self._tell(item, exc)
                continue
            except Exception as exc:
                # Said once per reply; its retries (every minute at most) only at INFO.
                log.log(logging.WARNING if item.attempts == 0 else logging.INFO,
                        "sending to %s:%s failed (will retry): %s", item.channel, item.chat_id, exc)
                await self.store.mark_outbound(item.id, OutboundStatus.PENDING, error=str(exc)[:500])
                return exc.seconds if isinstance(exc, RetryLater) else 0.0
            await self.store.mark_sent(item.id, external_id)
            self.metrics.inc("openclaw_outbound_messages_total", channel=item.channel)
        return None

    async def _tell(self, item: OutboundMessage, refusal: DeliveryRefused) -> bool:
        """Hand a refusal of the whole chat to `on_chat_refused`; whether it was handled."""
        if self.on_chat_refused is None:
            return False
        try:
            await self.on_chat_refused(item.channel, item.chat_id, refusal)
            return True
        except Exception:  # what the chat was still owed is not this reply's business
            log.exception("handling the refusal of %s:%s failed", item.channel, item.chat_id)
            return False


def _jitter(delay: float) -> float:
    return delay * random.uniform(0.8, 1.2)


def chunk_text(text: str, limit: int) -> list[str]:
    """Split `text` into pieces of at most `limit` characters, preferring paragraph, then line,
    then word boundaries. A piece that ends inside a ``` code fence closes it, and the next piece
    reopens it (with the same info string, unless that is long), so each message renders on its
    own."""
    if limit < 16:
        raise ValueError("chunk limit must be at least 16 characters")
    pieces: list[str] = []
    rest = text
    reopen = ""
    while rest:
        if len(reopen) + len(rest) <= limit:
            pieces.append(reopen + rest)
            break
        # Cut in `rest`, after the reopened fence: every round takes some text, however long the
        # fence line (cutting reopen + rest could take no more than the fence line each round).
        cut = _best_cut(rest, limit - len(reopen) - 4)  # room for a closing "\n```"
        piece, rest = reopen + rest[:cut], rest[cut:].lstrip("\n")
        fence = _open_fence(piece)
        if fence is not None:
            piece = piece.rstrip("\n") + "\n```"
            # A fence line as long as the limit would leave no room for what it reopens.
            reopen = (fence if len(fence) <= limit // 4 else "```") + "\n"
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
    """The opening fence line (e.g. "```python") if `piece` ends inside a code block. As in
    CommonMark, a line whose info string holds a backtick ("```ls -l```") opens none: it is code
    on one line, and reopening it in every later piece would repeat it."""
    fence = None
    for line in piece.split("\n"):
        stripped = line.strip()
        if not stripped.startswith("```"):
            continue
        if fence is not None:
            fence = None
        elif "`" not in stripped.lstrip("`"):
            fence = stripped
    return fence
