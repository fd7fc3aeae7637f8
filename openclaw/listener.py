"""A listening TCP socket for an aiohttp application that holds under a flood of connections.

aiohttp parses and answers the requests; in front of its protocol each connection first passes a
gate, which aiohttp has no setting for:
- `max_connections`: over it, the oldest connections that have not yet sent a whole request head
  are dropped, each once it has had SETTLE_S to send one (a real client sends its head at once, so
  it is past the gate by then). At twice it, a newcomer takes the place of the oldest of them at
  once, whatever its age, one that sent part of a head before one that sent nothing yet; with none
  (every connection is being answered) the newcomer is dropped. Half-sent requests from any local
  account then cost the daemon at most twice `max_connections` descriptors, and a real request
  still gets in during the flood. Dropping closes the socket unanswered: nothing to write, the
  descriptor freed at once.
- the request head must arrive whole within `read_timeout` (else 408) and `max_head_bytes` (else
  431), so a slow or endless head holds nothing for long.
The listening server is made here rather than by aiohttp's TCPSite, which hands aiohttp's protocol
to the loop directly and leaves no place for the gate; the runner (AppRunner) is aiohttp's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# How long a new connection is safe from being dropped to get back to the cap: time for a real
# client's head, sent at once, to be read.
SETTLE_S = 0.05
CEILING = 2  # times max_connections: open at once, at most
# The kernel's queue of connections not yet accepted, which is also how many asyncio accepts in
# one go: a flood waits in the kernel (it costs the daemon nothing there), and a burst of accepts
# stays too small to push out a real request before its head is read.
BACKLOG = 16

# A small body after an answer of ours (a 431 for a huge head) is read and dropped, so that closing
# the socket does not reset the connection before the client has read the answer.
MAX_DISCARD_BYTES = 64 * 1024
LINGER_S = 1.0

_ANSWERS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}


class Listener:
    """Accepts connections for `protocol_factory` (an aiohttp runner's `server`) through the gate."""

    def __init__(self, protocol_factory: Callable[[], asyncio.Protocol], *, max_connections: int,
                 max_head_bytes: int, read_timeout: float,
                 on_drop: Callable[[], None] | None = None) -> None:
        self.protocol_factory = protocol_factory
        self.max_connections, self.max_head_bytes = max_connections, max_head_bytes
        self.read_timeout = read_timeout
        self.on_drop = on_drop
        self._server: asyncio.Server | None = None
        # Not yet handed to aiohttp (reading a head, or closing after our answer), oldest first,
        # with when each came (loop time): the ones dropped, oldest first, over the cap.
        self._gated: dict[_Gate, float] = {}
        self._passed: set[_Gate] = set()  # handed to aiohttp, until closed
        self._trim: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, backlog: int = BACKLOG) -> tuple[str, int]:
        """Listen on host:port; the address bound (port 0 picks one). An OSError as the loop
        raises it (EADDRINUSE for a port taken). `backlog`: an API server whose clients come in
        bursts wants a longer queue than the admin port's scraper."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Gate(self), host, port, backlog=backlog)
        bound = self._server.sockets[0].getsockname()
        return bound[0], bound[1]

    @property
    def connections(self) -> int:
        """Connections open now, gated or served."""
        return len(self._gated) + len(self._passed)

    def close(self) -> None:
        """Stop listening and reset the connections that sent no whole request yet; the ones
        aiohttp serves are its runner's to end (AppRunner.cleanup)."""
        if self._server is not None:
            self._server.close()
        if self._trim is not None:
            self._trim.cancel()
        for gate in list(self._gated):
            gate.drop()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # ---- the gate's bookkeeping ----------------------------------------------------------------

    def _admit(self, gate: _Gate) -> bool:
        now = asyncio.get_running_loop().time()
        full = self.connections >= CEILING * self.max_connections
        if full and not self._drop_oldest(now, any_age=True):
            self._dropped()
            return False
        self._gated[gate] = now
        self._schedule_trim()
        return True

    def _drop_oldest(self, now: float, any_age: bool = False) -> bool:
        """Drop the oldest connection without a whole head that has had SETTLE_S to send one (or
        of `any_age`): first one that sent part of a head (a slow sender shown to be one), then
        one that sent nothing yet (a real client's head may be on its way)."""
        for partial in (True, False):
            for gate, came in self._gated.items():
                if now - came < SETTLE_S and not any_age:
                    break  # the oldest left is new: so are all the others
                if gate.sent_part == partial:
                    gate.drop()
                    return True
        return False

    def _trim_to_cap(self) -> None:
        """Back to the cap, as far as connections without a whole head allow (the ones aiohttp
        serves end by themselves, each after one answer)."""
        self._trim = None
        now = asyncio.get_running_loop().time()
        while self.connections > self.max_connections and self._drop_oldest(now):
            pass
        self._schedule_trim()

    def _schedule_trim(self) -> None:
        if self._trim is None and self._gated and self.connections > self.max_connections:
            loop = asyncio.get_running_loop()
            oldest = next(iter(self._gated.values()))
            self._trim = loop.call_at(max(oldest + SETTLE_S, loop.time()), self._trim_to_cap)

    def _pass(self, gate: _Gate) -> None:
        del self._gated[gate]
        self._passed.add(gate)

    def _forget(self, gate: _Gate) -> None:
        self._gated.pop(gate, None)
        self._passed.discard(gate)

    def _dropped(self) -> None:
        if self.on_drop is not None:
            self.on_drop()


class _Gate(asyncio.Protocol):
    """One connection: holds its bytes until the request head is whole, then hands the transport
    and those bytes to aiohttp's protocol and forwards every later event to it."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._head = bytearray()
        self._inner: asyncio.Protocol | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._discarded: int | None = None  # bytes dropped after our own answer; None before it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if not self._listener._admit(self):
            transport.abort()
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._listener.read_timeout, self._answer, 408)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        elif self._discarded is not None:
            self._discarded += len(data)
            if self._discarded > MAX_DISCARD_BYTES:
                self._close()
        else:
            self._head += data
            end = _head_end(self._head)
            if end is not None and end <= self._listener.max_head_bytes:
                self._pass_on()
            elif end is not None or len(self._head) > self._listener.max_head_bytes:
                self._answer(431)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        if self._discarded is None and self._head.strip():
            self._answer(400)  # a head cut off by the client's half-close; it reads the answer
        self._close()  # what is written still goes out first
        return True  # closed by _close, not by the transport mid-write

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._listener._forget(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    @property
    def sent_part(self) -> bool:
        """Whether part of a head came (and no whole one yet)."""
        return bool(self._head)

    def drop(self) -> None:
        """Close the connection now, unanswered: over the cap, or the listener closing."""
        self._listener._forget(self)
        self._listener._dropped()
        self._cancel_timer()
        if self._transport is not None:
            self._transport.abort()

    def _pass_on(self) -> None:
        self._cancel_timer()
        self._listener._pass(self)
        self._inner = self._listener.protocol_factory()
        self._inner.connection_made(self._transport)
        head, self._head = bytes(self._head), bytearray()
        self._inner.data_received(head)

    def _answer(self, status: int) -> None:
        """Answer `status` ourselves, then wait briefly for the client to close, dropping what it
        still sends: closing a socket with unread input resets it, which can destroy the answer
        before the client reads it."""
        self._cancel_timer()
        if self._discarded is not None or self._transport is None:
            return
        self._discarded = 0
        body = f"{_ANSWERS[status]}\n".encode()
        self._transport.write(
            f"HTTP/1.1 {status} {_ANSWERS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(LINGER_S, self._close)

    def _close(self) -> None:
        self._cancel_timer()
        if self._transport is not None:
            self._transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _head_end(buffer: bytes | bytearray) -> int | None:
    """Where the request head ends, its blank line included; None while it has not."""
    # CRLF is the standard; a bare LF head is passed on too, for aiohttp to refuse (400) at once.
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None
