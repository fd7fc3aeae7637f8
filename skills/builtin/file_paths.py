"""Where a path in the files skill really leads, and opening it there safely: the folders a principal
may use, resolving a caller's path into one of them (or denying it with the reason), opening files and
folders through descriptors so that the resolved path is the one worked on, and the checks and whole
reads and writes done on those descriptors.

Containment has two layers. First every path is resolved to where it really is (symlinks and `..`
followed, as the kernel would) and must lie inside one of the principal's folders; that check gives the
denial its wording. Then the work is done through file descriptors opened one component at a time from
the folder's own descriptor, each with O_NOFOLLOW, so a symlink swapped in after the check (the
sandboxed shell can write the same workspace) cannot lead the operation anywhere else.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from sandbox.fs_identity import as_daemon
from sandbox.policy import Principal
from sandbox.runner import SANDBOX_UID, WORKSPACE_MOUNT
from skills.base import SkillDenied, SkillError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
# O_NONBLOCK: opening a FIFO someone left in the workspace must not hang the daemon.
FILE_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


@dataclass(frozen=True)
class _Root:
    real: str  # resolved; containment is checked against this
    configured: str  # as the admin wrote it, for messages
    writable: bool
    workspace: bool

    def shown(self) -> str:
        if self.workspace:
            return WORKSPACE_MOUNT
        return self.configured + ("" if self.writable else " (read-only)")


@dataclass(frozen=True)
class Target:
    raw: str  # as the caller wrote it
    root: _Root  # the folder the resolved path lies in
    parts: tuple[str, ...]  # the resolved path below root.real, no symlinks, no dots
    uid: int = SANDBOX_UID  # the principal's sandbox uid: owner of what we create in its workspace

    def shown(self, parts: tuple[str, ...] | None = None) -> str:
        return _show(self.root, self.parts if parts is None else parts)


def _show(root: _Root, parts: tuple[str, ...]) -> str:
    """Workspace paths relative (as the model writes them), other folders' paths absolute."""
    if root.workspace:
        return q("/".join(parts)) if parts else WORKSPACE_MOUNT
    return q(os.path.join(root.real, *parts))


def q(text: str) -> str:
    """A name as it may be shown: quoted when it holds newlines or other control characters, so a
    file name cannot forge extra lines in a listing or an approval prompt."""
    return text if text.isprintable() else repr(text)


def _real(path: str) -> str:
    # One seam for the test that fools the first layer and checks the second still holds.
    return os.path.realpath(path)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _roots(principal: Principal) -> list[_Root]:
    return [_Root(_real(str(path)), str(path), writable, index == 0)
            for index, (path, writable) in enumerate(principal.file_roots())]


def _listing(roots: list[_Root]) -> str:
    return ", ".join(root.shown() for root in roots)


def _root_of(path: str, roots: list[_Root]) -> _Root | None:
    """The innermost folder holding `path`: a read-only folder inside a writable one stays read-only
    (and a workspace inside a read-only folder stays writable)."""
    holding = [root for root in roots if _inside(path, root.real)]
    return max(holding, key=lambda root: len(root.real), default=None)


def resolve(raw: str, principal: Principal) -> Target:
    """Where `raw` leads: inside one of the principal's folders, or a SkillDenied saying how it leaves."""
    roots = _roots(principal)
    if not raw.strip():
        raise SkillError("the path is empty; use \".\" for the workspace")
    if "\0" in raw:
        raise SkillError("the path contains a NUL character")
    workspace = roots[0]
    if raw == WORKSPACE_MOUNT or raw.startswith(WORKSPACE_MOUNT + "/"):
        # The shell skill shows the workspace at /workspace; the model reuses those paths here.
        joined = os.path.join(workspace.real, raw[len(WORKSPACE_MOUNT):].lstrip("/"))
    else:
        joined = os.path.join(workspace.real, raw)  # an absolute `raw` replaces the workspace
    lexical = os.path.normpath(joined)
    if not any(_inside(lexical, root.real) or _inside(lexical, os.path.normpath(root.configured))
               for root in roots):
        raise SkillDenied(f"{q(raw)} is outside your folders ({_listing(roots)})")
    # Not realpath(lexical): "link/.." means the link's parent to the kernel, not ".".
    real = _real(joined)
    root = _root_of(real, roots)
    if root is None:
        raise SkillDenied(f"{q(raw)} {_how_it_leaves(joined, roots)} outside your folders "
                          f"({_listing(roots)})")
    parts = tuple(part for part in real[len(root.real):].split("/") if part)
    return Target(raw, root, parts, uid=principal.scope.uid)


def _how_it_leaves(joined: str, roots: list[_Root]) -> str:
    """Which symlink takes `joined` out of the folders, for the denial message."""
    parts = [part for part in joined.split("/") if part not in ("", ".")]
    current = "/"
    for index, part in enumerate(parts):
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        if os.path.islink(step):
            target = _real(step)
            if _root_of(target, roots) is None:
                # Where it points is not said: this runs as the daemon, and the link may sit in a
                # folder the user may not read (another user's, inside a shared one).
                if index == len(parts) - 1:
                    return "is a symbolic link that leads"
                root = _root_of(current, roots)
                link = _show(root, tuple(os.path.relpath(step, root.real).split("/"))) if root else q(step)
                return f"goes through {link}, a symbolic link that leads"
            step = target
        current = step
    return "leads"


def _open_dir(target: Target, parts: tuple[str, ...], *, create: bool = False, hint: str = "") -> int:
    """A descriptor for the folder root/parts, every component opened with O_NOFOLLOW from the one
    above it. With `create`, missing folders are made (and given to the sandbox uid in a workspace
    when we are root, so the sandboxed shell can change what we made). `hint` is added when the last
    component turns out not to be a folder."""
    chown = create and target.root.workspace and os.geteuid() == 0
    try:
        with as_daemon():  # the admin's folder, as configured; its parents are not the user's to walk
            granted = os.open(target.root.real, DIR_FLAGS & ~os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SkillError(f"the folder {target.root.configured} does not exist") from None
    try:
        # The folder itself opened again as whoever acts now: a descriptor opened as root would
        # list a folder the user may not read (reads through it are not checked again).
        fd = os.open(".", DIR_FLAGS, dir_fd=granted)
    finally:
        os.close(granted)
    try:
        for index, part in enumerate(parts):
            where = parts[:index + 1]
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise SkillError(f"{target.shown(where)} does not exist") from None
                made = _mkdir(fd, part)
                child = _open_or_deny(target, where, fd, part, DIR_FLAGS)
                if made and chown:
                    os.fchown(child, target.uid, target.uid)
            except OSError as exc:
                _deny_if_link(target, where, fd, part, exc)
                if exc.errno != errno.ENOTDIR:
                    raise
                last = hint if index == len(parts) - 1 else ""
                raise SkillError(f"{target.shown(where)} is not a folder{last}") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _mkdir(fd: int, name: str) -> bool:
    try:
        os.mkdir(name, 0o777, dir_fd=fd)
        return True
    except FileExistsError:  # made meanwhile by someone else; opening it checks what it is
        return False


def _open_or_deny(target: Target, where: tuple[str, ...], fd: int, name: str, flags: int,
                  mode: int = 0o666) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=fd)
    except OSError as exc:
        _deny_if_link(target, where, fd, name, exc)
        raise


def _deny_if_link(target: Target, where: tuple[str, ...], fd: int, name: str, exc: OSError) -> None:
    """An O_NOFOLLOW open refused a component: if it is a symlink, the path changed after we resolved
    it (or the link loops); never follow it."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
        return
    try:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        is_link = False
    if is_link or exc.errno == errno.ELOOP:
        raise SkillDenied(f"{q(target.raw)}: {target.shown(where)} is a symbolic link that was not "
                          "there when the path was checked (or it loops); it is not followed") from None


def open_beneath(dir_fd: int, parts: tuple[str, ...], flags: int) -> int:
    """A descriptor for the file dir_fd/parts[0]/.../parts[-1], for code with no Target (a SKILL.md
    skill's files): each folder opened with O_NOFOLLOW from the one above it, as _open_dir does, and
    the file with `flags | FILE_FLAGS`. A symlink anywhere below dir_fd is an OSError (ELOOP or
    ENOTDIR), never followed; a FIFO opens without waiting for a writer (check it with fstat)."""
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


def open_file(target: Target, flags: int, *, create: bool = False) -> tuple[int, bool]:
    """(descriptor, whether we created the file) for the target file, through _open_dir."""
    if not target.parts:
        raise SkillError(f"{target.shown()} is a folder; use action \"list\"")
    parent = _open_dir(target, target.parts[:-1], create=create)
    name = target.parts[-1]
    try:
        if create:
            try:
                return os.open(name, flags | FILE_FLAGS | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=parent), True
            except FileExistsError:
                pass
        try:
            fd = _open_or_deny(target, target.parts, parent, name, flags | FILE_FLAGS)
        except FileNotFoundError:
            raise SkillError(f"{target.shown()} does not exist") from None
        except IsADirectoryError:
            raise SkillError(f"{target.shown()} is a folder; use action \"list\"") from None
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ENODEV):  # a pipe with no reader, a socket
                raise _not_regular(target) from None
            raise
        return fd, False
    finally:
        os.close(parent)


def stat_now(target: Target) -> os.stat_result | None:
    """The target file as it is now (a final symlink not followed), reached as open_file reaches
    it; None when it or a folder on the way is missing or cannot be reached."""
    if not target.parts:
        return None
    try:
        parent = _open_dir(target, target.parts[:-1])
    except (SkillError, OSError):
        return None
    try:
        return os.stat(target.parts[-1], dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(parent)


def open_folder(target: Target) -> int:
    """A descriptor for the target folder, through _open_dir."""
    return _open_dir(target, target.parts, hint="; use action \"read\" for a file")


def _not_regular(target: Target) -> SkillError:
    return SkillError(f"{target.shown()} is not a regular file (a device, socket or pipe)")


def regular(target: Target, fd: int) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise SkillError(f"{target.shown()} is a folder; use action \"list\"")
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(target)
    return st


def pread_all(fd: int, size: int, offset: int) -> bytes:
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
    view = memoryview(data)
    while view:
        done = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[done:]
        if offset is not None:
            offset += done


def give_to_sandbox(target: Target, fd: int) -> None:
    # Only what we created, only in the workspace: the sandboxed shell runs as this uid and must be
    # able to change the files the model made for it. Never anything outside the workspace.
    if target.root.workspace and os.geteuid() == 0:
        os.fchown(fd, target.uid, target.uid)


def too_big(target: Target, size: int, limit: int, what: str) -> SkillDenied:
    return SkillDenied(f"{what} {target.shown()} would make it {size:,} bytes, over your file size limit "
                       f"of {limit:,} bytes; nothing was written")


def require_writable(target: Target) -> None:
    if not target.root.writable:
        raise SkillDenied(f"{q(target.raw)} is in {target.root.configured}, which is read-only for you")
