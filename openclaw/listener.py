"""A listening TCP socket for an aiohttp application that holds under a flood of connections.

aiohttp parses and answers the requests; in front of its protocol each connection first passes a
gate, which aiohttp has no setting for:
- at most `max_connections` at once. Over it, the oldest connection that has not yet sent a whole
  request head is dropped, else the new one is: half-sent requests from any local account then cost
  the daemon at most that many descriptors, and a real client, which sends its head at once, still
  gets in. Dropping is an abort (a reset): no answer to write, the descriptor freed at once.
- the request head must arrive whole within `read_timeout` (else 408) and `max_head_bytes` (else
  431), so a slow or endless head holds nothing for long.
The listening server is made here rather than by aiohttp's TCPSite, which hands aiohttp's protocol
to the loop directly and leaves no place for the gate; the runner (AppRunner) is aiohttp's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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
        # Not yet handed to aiohttp (reading a head, or closing after our answer), oldest first:
        # the ones dropped first when the cap is reached.
        self._gated: dict[_Gate, None] = {}
        self._passed: set[_Gate] = set()  # handed to aiohttp, until closed

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on host:port; the address bound (port 0 picks one). An OSError as the loop
        raises it (EADDRINUSE for a port taken)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Gate(self), host, port)
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
        for gate in list(self._gated):
            gate.drop()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # ---- the gate's bookkeeping ----------------------------------------------------------------

    def _admit(self, gate: _Gate) -> bool:
        if self.connections >= self.max_connections:
            if not self._gated:  # every slot serves a request: the newcomer waits for none
                self._dropped()
                return False
            next(iter(self._gated)).drop()
        self._gated[gate] = None
        return True

    def _pass(self, gate: _Gate) -> None:
        self._gated.pop(gate, None)
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

    def drop(self) -> None:
        """Reset the connection now, unanswered: over the cap, or the listener closing."""
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


def _head_end(buffer: bytearray) -> int | None:
    """Where the request head ends, its blank line included; None while it has not."""
    # CRLF is the standard; a bare LF head is passed on too, for aiohttp to refuse (400) at once.
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None
