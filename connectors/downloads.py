"""Downloading the files users send over HTTP, streamed into save_attachment's writer, with errors
that never name the file's URL (it may hold a secret: a signature, a bot token)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from connectors.attachments import Writer

if TYPE_CHECKING:  # aiohttp is imported when a connector first downloads: the CLI need not load it
    import aiohttp
    import yarl

DOWNLOAD_CHUNK = 1 << 16


class DownloadFailed(Exception):
    """A file could not be fetched. The message is the note's reason as it is, and names no URL."""


def reason_for(exc: BaseException) -> str:
    """Why a download failed, for the note and the log: a DownloadFailed's message, or the
    exception's type and message."""
    return str(exc) if isinstance(exc, DownloadFailed) else f"{type(exc).__name__}: {exc}"


class FileDownloads:
    """A connector's own HTTP session for the files users send, streamed into save_attachment's
    writer: nothing is held in memory beyond a chunk, and a file passing the limit ends the
    transfer there (the connection is closed, not drained). The session is made on first use (a
    message recovered at start-up is fetched before the connector's start() is done) and closed
    by `close()`, from the connector's stop(). `source` names the server in notes ("Discord's
    CDN"); `refused(status, reason)` words a non-200 answer (default: "<source> answered 404 Not
    Found"). A stalled connection times out after `read_timeout` seconds without data; a whole
    large, slow file has no time limit. `trust_env`: use the HTTP(S)_PROXY environment variables."""

    def __init__(self, source: str, *, refused: Callable[[int, str], str] | None = None,
                 connect_timeout: float = 30.0, read_timeout: float = 60.0,
                 trust_env: bool = False) -> None:
        self.source, self._refused = source, refused
        self._timeouts, self._trust_env = (connect_timeout, read_timeout), trust_env
        self._session: aiohttp.ClientSession | None = None

    async def fetch(self, url: str | yarl.URL, out: Writer) -> None:
        """GET `url` and write its body into `out` as it arrives. Raises DownloadFailed (never
        naming the URL) for an answer other than 200 and for network errors and timeouts; what
        `out.write` raises (FileTooBig) passes through."""
        import aiohttp

        if self._session is None or self._session.closed:
            connect, read = self._timeouts
            self._session = aiohttp.ClientSession(
                trust_env=self._trust_env,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read))
        try:
            async with self._session.get(url) as response:
                if response.status != 200:
                    reason = response.reason or ""
                    raise DownloadFailed(self._refused(response.status, reason) if self._refused
                                         else f"{self.source} answered {response.status} {reason}")
                try:
                    async for chunk in response.content.iter_chunked(DOWNLOAD_CHUNK):
                        out.write(chunk)
                except BaseException:  # FileTooBig, a cancelled turn: drop the rest unread
                    response.close()
                    raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            # `from None`: the cause names the URL (a connect timeout, a bad redirect do)
            raise DownloadFailed(f"the connection to {self.source} failed "
                                 f"({_without_urls(exc)})") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _without_urls(exc: BaseException) -> str:
    """An exception's type and message with every URL cut to its scheme and host (aiohttp names
    the URL in some errors, and its path, query or user part may hold a secret)."""
    import aiohttp

    text = "" if isinstance(exc, aiohttp.InvalidURL) else str(exc)  # all URL, maybe not parseable
    text = re.sub(r"\b([a-z][a-z0-9+.-]*://)(?:[^/\s'\"@]*@)?([^/\s'\"]*)[^\s'\"]*", r"\1\2/…",
                  text, flags=re.IGNORECASE)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
