"""File I/O through descriptors, for skill code that works in folders others can write (the files
skill, SKILL.md folders): a file opened below a folder's descriptor never follows a symlink or waits
on a FIFO, and reads and writes are whole."""

from __future__ import annotations

import errno
import os

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
# O_NONBLOCK: opening a FIFO someone left in the folder must not hang the daemon.
FILE_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def open_beneath(dir_fd: int, parts: tuple[str, ...], flags: int) -> int:
    """A descriptor for the file dir_fd/parts[0]/.../parts[-1]: each folder opened with O_NOFOLLOW
    from the one above it, and the file with `flags | FILE_FLAGS`. A symlink anywhere below dir_fd
    is an OSError (ELOOP or ENOTDIR), never followed; a FIFO opens without waiting for a writer
    (check it with fstat)."""
    if not parts or any(part in ("", ".", "..") or "/" in part for part in parts):
        raise OSError(errno.EINVAL, "not a plain relative path", "/".join(parts))
    fd = os.open(".", DIR_FLAGS, dir_fd=dir_fd)
    try:
        for part in parts[:-1]:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(parts[-1], flags | FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def pread_all(fd: int, size: int, offset: int) -> bytes:
    """Up to `size` bytes from `offset`, fewer only at the end of the file."""
    chunks, left = [], size
    while left > 0:
        chunk = os.pread(fd, min(left, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    """All of `data`, at `offset` (pwrite) or at the file's position."""
    view = memoryview(data)
    while view:
        done = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[done:]
        if offset is not None:
            offset += done
