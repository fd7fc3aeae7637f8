"""The workspace and granted folders of a scope, opened through no symlink a command could have put there.

A command can rename and create anything in the folders it may write (the workspace, `read_write`
grants), so a path that leads through one of them is the command's to redirect: a read-only folder
inside the workspace (`mv a c; mkdir a; ln -s /root/.config/openclaw a/ref`), or a workspace inside
a writable share (`ln -s /etc alice`) would make the next run bind (and, as root, chown) whatever
the link names. Each folder is therefore opened one component at a time: a symlink is followed only
outside the writable folders (the admin's own links, /srv -> /mnt/data), and one inside them is
refused. bwrap then binds the descriptor (`--bind-fd`), not the path, so a swap after the check
changes nothing; see `Grant.pinned` for the binds that must still go by path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path

MAX_LINKS = 40  # as the kernel's own limit on symlinks in one lookup (ELOOP)
_DIR = os.O_PATH | os.O_CLOEXEC


class UnsafeGrant(PermissionError):
    """A granted folder leads through a symlink inside a folder commands may write."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def open_folder(path: Path, writable: set[tuple[int, int]]) -> int:
    """An O_PATH descriptor of `path` as the kernel would resolve it, except that a symlink met
    inside a folder of `writable` (device, inode), or below one, raises UnsafeGrant."""
    parts = deque(os.path.abspath(path).split("/"))  # no normpath: ".." as the kernel takes it
    fd = os.open("/", _DIR | os.O_DIRECTORY)
    inside, links = _identity(os.fstat(fd)) in writable, 0
    try:
        while parts:
            name = parts.popleft()
            if name in ("", "."):
                continue
            step = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            st = os.fstat(step)
            if stat.S_ISLNK(st.st_mode):
                os.close(step)
                if inside:
                    raise UnsafeGrant(f"{path} leads through a symlink ({name!r}) inside a folder "
                                      "sandboxed commands may write; a command may have put it there")
                links += 1
                if links > MAX_LINKS:
                    raise UnsafeGrant(f"{path}: too many levels of symbolic links")
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR | os.O_DIRECTORY)
                    inside = _identity(os.fstat(fd)) in writable
                parts.extendleft(reversed(target.split("/")))
                continue
            os.close(fd)
            fd = step
            # Once in a writable folder, stay wary also after a "..": conservative, and simple.
            inside = inside or _identity(st) in writable
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path))
        return fd
    except (FileNotFoundError, NotADirectoryError) as exc:
        os.close(fd)
        if inside and isinstance(exc, FileNotFoundError):
            # bwrap would look it up again, by then maybe through a symlink a command put there.
            raise UnsafeGrant(f"{path} does not exist (inside a folder sandboxed commands may "
                              "write); create it, or take it out of the role") from None
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        os.close(fd)
        raise


def real_path(fd: int) -> Path:
    """Where the folder open as `fd` is now, every symlink resolved."""
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


@dataclass(frozen=True)
class Grant:
    path: Path  # its real path, as the kernel names it
    fd: int | None  # None: it does not exist
    writable: bool


@dataclass
class Grants:
    """The scope's folders, open: the workspace first, then read_write, then read_only."""

    workspace: Grant
    others: list[Grant]

    @classmethod
    def open(cls, workspace: Path, read_write: tuple[Path, ...] = (),
             read_only: tuple[Path, ...] = ()) -> Grants:
        """Writable folders first, the shallower before the deeper, so a writable folder given
        through another one is checked like any other path inside it."""
        writable: set[tuple[int, int]] = set()
        opened: list[Grant] = []
        found: Grant | None = None
        try:
            wanted = [(workspace, True, True), *((p, True, False) for p in read_write)]
            wanted.sort(key=lambda item: len(Path(os.path.abspath(item[0])).parts))
            for path, is_writable, is_workspace in wanted + [(p, False, False) for p in read_only]:
                try:
                    fd = open_folder(path, writable)
                except FileNotFoundError:
                    if is_workspace:
                        raise
                    # Outside every writable folder (see open_folder): left to bwrap, whose
                    # setup then fails saying which, as it always did.
                    opened.append(Grant(Path(os.path.abspath(path)), None, is_writable))
                    continue
                grant = Grant(real_path(fd), fd, is_writable)
                opened.append(grant)
                if is_writable:
                    writable.add(_identity(os.fstat(fd)))
                if is_workspace:
                    found = grant
        except BaseException:
            for grant in opened:
                if grant.fd is not None:
                    os.close(grant.fd)
            raise
        assert found is not None
        return cls(found, [g for g in opened if g is not found])

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(g.fd for g in (self.workspace, *self.others) if g.fd is not None)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Grants:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
