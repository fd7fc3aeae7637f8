"""Saving the files users send into their workspace: safe names, a size limit, never overwriting,
and no partial file left behind."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import BinaryIO, Protocol

from openclaw.gateway.contract import Folder

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 20 * 1024 * 1024  # the largest file a user may send (Telegram's limit for bots)
MAX_FILE_NAME_BYTES = 120


class FileTooBig(Exception):
    """A download wrote more than its limit (whatever size the service had stated)."""


class Writer(Protocol):
    """Where a download writes the bytes (save_attachment hands it one)."""

    def write(self, data: bytes, /) -> int: ...


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
                          channel: str, why: Callable[[BaseException], str]
                          ) -> tuple[str | None, str | None]:
    """What `fetch_attachment` does: save one file a user sent into `folder` (their workspace) as
    `name` (from safe_file_name), or "name-1"... if taken: (its name there, None), or (None, a note
    for the agent saying why not). A `size` over `max_bytes` is refused before any download;
    `download(out)` writes the bytes into `out`, which raises FileTooBig past `max_bytes` (a stated
    size may be wrong), and an exception of `errors` becomes the note, worded by `why(exc)` (for the
    log too). A failed or stopped download leaves no partial file."""
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
        reason = why(exc)
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
