"""The workspace and granted folders of a scope, opened through no symlink a command could have put there.

A command can rename and create anything in the folders it may write (the workspace, `read_write`
grants), so a path that leads through one of them is the command's to redirect: a read-only folder
inside the workspace (`mv a c; mkdir a; ln -s /root/.config/openclaw a/ref`), or a workspace inside
a writable share (`ln -s /etc alice`) would make the next run bind (and, as root, chown) whatever
the link names. Each folder is therefore opened one component at a time: a symlink is followed only
outside the writable folders (the admin's own links, /srv -> /mnt/data), and one inside them is
refused: a read_write folder (nested in another writable one) is left out of the command, which is
told; the workspace or a read-only folder refuses it.
bwrap then binds the descriptor (`--bind-fd`), not the path, so a swap after the check
changes nothing (sandbox.bwrap._binds: every granted folder, also where it is bound a second
time, and why a destination inside a writable folder needs the system folders bound again).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.scope import Scope

MAX_LINKS = 40  # as the kernel's own limit on symlinks in one lookup (ELOOP)
_DIR = os.O_PATH | os.O_CLOEXEC


class UnsafeGrant(PermissionError):
    """A granted folder leads through a symlink inside a folder commands may write."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def open_folder(path: Path, writable: set[tuple[int, int]]) -> int:
    """An O_PATH descriptor of `path` as the kernel would resolve it, except that a symlink met
    inside a folder of `writable` (device, inode), or below one, raises UnsafeGrant; so does a
    folder missing there, or a file in its place."""
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
                              "write); put back what was moved or renamed on its way (a new "
                              "empty folder there would hide where its files went), or ask the "
                              "admin to take it out of the role") from None
        if inside:
            # A file where the folder (or one on its way) was: a command may have put it there
            # (`mv albums albums2; touch albums`) as well as a link, and is as refused: a
            # read_write folder left out, not every command until an admin steps in.
            raise UnsafeGrant(f"{path} is not a folder (a file in its place, inside a folder "
                              "sandboxed commands may write); a command may have put it there") from None
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        os.close(fd)
        raise


def writable_folders(scope: Scope) -> set[tuple[int, int]]:
    """(device, inode) of every folder a sandboxed command may write, as open_folder takes them:
    the scope's own (workspace, read_write) and other principals' (its others_writable)."""
    return _writable_now((scope.workspace, *scope.read_write, *scope.others_writable))


def _writable_now(paths: tuple[Path, ...]) -> set[tuple[int, int]]:
    """(device, inode) of each folder of `paths` that can be opened now, shallower first, each
    checked against those before it; one a command redirected adds a folder, and makes
    Grants.open refuse more, not less."""
    writable: set[tuple[int, int]] = set()
    for path in sorted(paths, key=lambda p: len(Path(os.path.abspath(p)).parts)):
        try:
            fd = open_folder(path, writable)
        except OSError:  # UnsafeGrant too: Grants.open says why
            continue
        try:
            writable.add(_identity(os.fstat(fd)))
        finally:
            os.close(fd)
    return writable


def hand_over(workspace_fd: int, uid: int) -> None:
    """Give the workspace's top folder, open as `workspace_fd` (never reached through a link a
    command put on its way), to the user's sandbox uid when we are root, so their commands and the
    files skill acting as them can work in it. Only the top folder: what the admin placed inside
    keeps its owner and mode."""
    if os.geteuid() != 0:
        return
    folder = f"/proc/self/fd/{workspace_fd}"  # the folder checked is the folder changed
    if os.stat(folder).st_uid != uid:
        os.chown(folder, uid, uid)


def real_path(fd: int) -> Path:
    """Where the folder open as `fd` is now, every symlink resolved."""
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


@dataclass(frozen=True)
class Grant:
    path: Path  # its real path, as the kernel names it
    fd: int | None  # None: it does not exist, or was refused
    writable: bool
    # Why it is not to be bound or opened: its path leads through a symlink, or to nothing, inside
    # a folder commands may write. Only a writable one (see Grants.open): the command still runs,
    # without it, so a user who renamed the share holding it (`mv photos photos2`) can put it back.
    refused: str | None = None


@dataclass
class Grants:
    """The scope's folders, open: the workspace first, then read_write, then read_only."""

    workspace: Grant
    others: list[Grant]

    # Descriptors of second binds of a folder (dup): bwrap closes each one it binds.
    extra: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, scope: Scope) -> Grants:
        """The folders of a sandbox.scope.Scope, open."""
        return cls.open(scope.workspace, scope.read_write, scope.read_only,
                        others_writable=scope.others_writable)

    @classmethod
    def open(cls, workspace: Path, read_write: tuple[Path, ...] = (),
             read_only: tuple[Path, ...] = (), *, others_writable: tuple[Path, ...] = ()) -> Grants:
        """Which folders are writable is learnt first, from all of them as their paths lead now,
        and only then is each opened: a writable folder given by a short path (through the admin's
        link, /fam -> /mnt/disk1/exports/family) may lie inside one given by a longer one, and
        must be checked as a path inside it. A link a command planted can only add to what is
        treated as writable: it makes the check stricter, never looser. `others_writable`: folders
        other principals' commands may write (their workspaces, their roles' read_write), where a
        link is no more this scope's admin's than in its own."""
        writable = _writable_now((workspace, *read_write, *others_writable))
        opened: list[Grant] = []
        found: Grant | None = None
        try:
            wanted = [(workspace, True, True), *((p, True, False) for p in read_write)]
            for path, is_writable, is_workspace in wanted + [(p, False, False) for p in read_only]:
                try:
                    fd = open_folder(path, writable)
                except UnsafeGrant as exc:
                    # A writable folder nested in another is left out: whatever a rename put
                    # there is writable through the outer one anyway. A read-only one refuses
                    # the command: left out, the folder moved away (`mv docs old`) would be
                    # writable where it now lies. So does the workspace.
                    if is_workspace or not is_writable:
                        raise
                    opened.append(Grant(Path(os.path.abspath(path)), None, is_writable, str(exc)))
                    continue
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
    def refused(self) -> list[str]:
        """Why each refused folder is left out (see Grant.refused)."""
        return [g.refused for g in self.others if g.refused is not None]

    def dup(self, fd: int) -> int:
        """Another descriptor of the folder open as `fd`, closed with the others: bwrap closes a
        descriptor once it has bound it, so a folder bound twice needs two."""
        self.extra.append(os.dup(fd))
        return self.extra[-1]

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(g.fd for g in (self.workspace, *self.others) if g.fd is not None)

    def close(self) -> None:
        for fd in (*self.fds, *self.extra):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Grants:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
