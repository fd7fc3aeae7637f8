"""What connectors share: chunking replies to a channel's limit, and saving the files users send
into their workspace (safe names, a size limit, never overwriting).

A connector translates between its library's objects and InboundMessage / outbound text, and
nothing else: access, storage and the agent live in `openclaw/`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, BinaryIO, Protocol

from openclaw.gateway.contract import Folder

if TYPE_CHECKING:  # aiohttp is imported when a connector first downloads: the CLI need not load it
    import aiohttp
    import yarl

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 20 * 1024 * 1024  # the largest file a user may send (Telegram's limit for bots)
MAX_FILE_NAME_BYTES = 120
DOWNLOAD_CHUNK = 1 << 16


class FileTooBig(Exception):
    """A download wrote more than its limit (whatever size the service had stated)."""


class DownloadFailed(Exception):
    """A file could not be fetched. The message is the note's reason as it is, and names no URL
    (a file's URL may hold a secret: a signature, a bot token)."""


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


# ---- files users send ---------------------------------------------------------------------------


def media_note(kind: str, text: str, *, with_files: bool = False) -> tuple[str, str | None]:
    """(text, notice) for a message carrying media the agent cannot open yet (`kind`: "a photo").
    With text or files left to answer, the agent is told about the media beside them; otherwise the
    user gets a fixed notice (sent after access control) and the model does not run."""
    if text or with_files:
        note = f"[The user sent {kind}, which I cannot open yet.]"
        return "\n\n".join(part for part in (note, text) if part), None
    return "", (f"Sorry, I cannot open {kind} yet: I read text messages and documents. "
                "Please type your message.")


async def save_attachment(folder: Folder, name: str, download: Callable[[Writer], Awaitable[object]],
                          *, size: int | None, max_bytes: int, errors: tuple[type[Exception], ...],
                          channel: str, why: Callable[[BaseException], str] | None = None
                          ) -> tuple[str | None, str | None]:
    """What `fetch_attachment` does: save one file a user sent into `folder` (their workspace) as
    `name` (from safe_file_name), or "name-1"... if taken: (its name there, None), or (None, a note
    for the agent saying why not). A `size` over `max_bytes` is refused before any download;
    `download(out)` writes the bytes into `out`, which raises FileTooBig past `max_bytes` (a stated
    size may be wrong), and an exception of `errors` becomes the note. A failed or stopped download
    leaves no partial file. `why(exc)` words an error for the note and the log (by default
    reason_for)."""
    if size is not None and size > max_bytes:
        return None, (f"[The user sent the file {name!r} ({size} bytes), too big for me "
                      f"to download: the limit is {max_bytes} bytes.]")
    saved_as, file = create_unique(folder, name)
    try:
        with file:
            await download(_BoundedWriter(file, max_bytes))
    except FileTooBig:
        _remove(folder, saved_as)
        log.warning("%s: %s is larger than the limit of %d bytes; not kept", channel, name, max_bytes)
        return None, (f"[The user sent the file {name!r}, too big for me to download: it is over "
                      f"the limit of {max_bytes} bytes.]")
    except errors as exc:
        _remove(folder, saved_as)
        reason = (why or reason_for)(exc)
        log.warning("%s: could not download %s: %s", channel, name, reason)
        return None, f"[The user sent the file {name!r}, but downloading it failed: {reason}]"
    except BaseException:  # /stop, shutdown, or a bug: still no half-written file
        _remove(folder, saved_as)
        raise
    return saved_as, None


def _remove(folder: Folder, name: str) -> None:
    """A half-saved file goes, by its name in the folder (never following a link put there)."""
    try:
        os.unlink(name, dir_fd=folder.fd)
    except FileNotFoundError:  # the user's commands may have moved it meanwhile
        pass


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


class Writer(Protocol):
    """Where a download writes the bytes (save_attachment hands it one)."""

    def write(self, data: bytes, /) -> int: ...


class _BoundedWriter:
    """The file being saved, until more than `limit` bytes in all are written (FileTooBig)."""

    def __init__(self, file: BinaryIO, limit: int) -> None:
        self._file, self._limit, self._written = file, limit, 0

    def write(self, data: bytes) -> int:
        self._written += len(data)
        if self._written > self._limit:
            raise FileTooBig(f"more than {self._limit} bytes")
        return self._file.write(data)


def safe_file_name(name: str | None, fallback: str) -> str:
    """A name that stays inside the folder: no path separators or control characters, no leading
    dot (hidden files, "..") and at most MAX_FILE_NAME_BYTES bytes, keeping the extension."""
    name = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    # Dots and spaces together: ". .bashrc" must not become ".bashrc" (nor ".. .." "..").
    name = "".join(ch for ch in name if ch.isprintable()).lstrip(". ").rstrip()
    name = name or fallback
    stem, dot, ext = name.rpartition(".")
    if not stem or len(ext) > 16:
        stem, dot, ext = name, "", ""
    while len(f"{stem}{dot}{ext}".encode()) > MAX_FILE_NAME_BYTES:
        stem = stem[:-1]
    return f"{stem.rstrip() or 'file'}{dot}{ext}"


def create_unique(folder: Folder, name: str) -> tuple[str, BinaryIO]:
    """Create `name` in `folder`, or "stem-1.ext", "stem-2.ext"... if taken: (the name it got, the
    file open for writing; the caller closes it). Never overwrites; exclusive creation relative to
    the folder's descriptor never writes through a symlink planted under the name, nor into a
    folder other than the one opened. The file is given to `folder.owner` before anything is
    written, through its descriptor: a name can be swapped meanwhile, the open file cannot."""
    stem, dot, ext = name.rpartition(".")
    if not stem:
        stem, dot, ext = name, "", ""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    number = 0
    while True:
        candidate = name if number == 0 else f"{stem}-{number}{dot}{ext}"
        try:
            fd = os.open(candidate, flags, 0o666, dir_fd=folder.fd)
        except FileExistsError:
            number += 1
            continue
        try:
            if folder.owner is not None:
                _give(fd, candidate, folder.owner)
            return candidate, os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            _remove(folder, candidate)
            raise


def _give(fd: int, name: str, owner: int) -> None:
    """Hand the new file to the uid the user's commands run as, or they could read it but not
    change it. A failure (a filesystem that refuses it) keeps the file, as the daemon's."""
    try:
        os.fchown(fd, owner, owner)
    except OSError as exc:
        log.warning("could not give the file %s to uid %d: %s", name, owner, exc)
