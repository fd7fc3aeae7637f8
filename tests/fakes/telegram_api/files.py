"""The fake Bot API's files: their content (possibly generated as it is sent), and each download
as it went, streamed a chunk at a time and cut or stalled where a test asks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web

CHUNK = 1 << 16  # how much of a file each write sends


@dataclass(frozen=True)
class Generated:
    """A file's content of `size` bytes of `fill`, made chunk by chunk as it is sent (a large file
    the fake does not hold in memory)."""

    size: int
    fill: bytes = b"x"

    def __len__(self) -> int:
        return self.size

    def chunks(self) -> Iterator[bytes]:
        block = (self.fill * (CHUNK // len(self.fill) + 1))[:CHUNK]
        for start in range(0, self.size, CHUNK):
            yield block[:min(CHUNK, self.size - start)]


Content = bytes | Generated


@dataclass
class Download:
    """One GET of a file: its status, and how many bytes of the body the server wrote before the
    download ended (all of it, the client closed the connection, or a cut)."""

    path: str
    status: int = 200
    sent: int = 0
    size: int = 0  # the whole body's length (Content-Length)
    complete: bool = False  # every byte was sent
    ended: bool = False  # the handler is done (so `sent` is final)



@dataclass
class Cut:
    """A download to break partway through."""

    after: int  # bytes sent before the break
    stall: bool  # hold the connection open silently instead of dropping it


def chunks(content: Content) -> Iterator[bytes]:
    if isinstance(content, Generated):
        return content.chunks()
    return (content[at:at + CHUNK] for at in range(0, len(content), CHUNK))


async def stream(request: web.Request, response: web.StreamResponse, content: Content,
                 record: Download, cut: Cut | None) -> None:
    """Send the body a chunk at a time, as far as the client takes it (or a cut allows)."""
    try:
        for chunk in chunks(content):
            if cut is not None and record.sent + len(chunk) > cut.after:
                chunk = chunk[:cut.after - record.sent]
                await response.write(chunk)
                record.sent += len(chunk)
                while cut.stall and _open(request):  # until the client gives up
                    await asyncio.sleep(0.02)
                if _open(request):
                    request.transport.close()  # the network breaks mid-file
                return
            await response.write(chunk)  # waits while the client does not read
            record.sent += len(chunk)
        await response.write_eof()
        record.complete = True
    except ConnectionError:  # the client closed the connection: stop sending
        pass


def _open(request: web.Request) -> bool:
    return request.transport is not None and not request.transport.is_closing()
