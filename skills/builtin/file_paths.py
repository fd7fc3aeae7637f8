"""Where a path in the files skill really leads, and opening it there safely: the folders a principal
may use, resolving a caller's path into one of them (or denying it with the reason), opening files and
folders through descriptors so that the resolved path is the one worked on, and the checks and whole
reads and writes done on those descriptors.

The folders themselves are opened first, once a call, by sandbox.grants as the shell's are: a
command can rename anything in the folders it may write, so a granted folder whose path leads through a
symlink inside one of them (`mv docs old; mkdir docs; ln -s ~/.config/openclaw docs/reference`) is
refused, never opened, and nothing below re-resolves a folder's path: all work starts from its
descriptor.

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
from pathlib import Path

from sandbox.fs_identity import as_daemon
from sandbox.grants import Grants, UnsafeGrant
from sandbox.policy import Principal
from sandbox.scope import SANDBOX_UID, WORKSPACE_MOUNT
from skills.base import SkillDenied, SkillError
from skills.fileio import DIR_FLAGS, FILE_FLAGS


@dataclass(frozen=True)
class _Root:
    real: str  # resolved; containment is checked against this
    configured: str  # as the admin wrote it, for messages
    writable: bool
    workspace: bool
    # O_PATH, opened by sandbox.grants and owned by the Folders it came from (None: the folder does
    # not exist, or was refused); every open below the folder starts here.
    fd: int | None = None
    refused: str | None = None  # why sandbox.grants refused it (Grant.refused): never opened

    def unavailable(self) -> SkillError:
        """Why nothing can be done in this folder (it has no descriptor)."""
        if self.refused:
            return SkillError(f"the folder {self.configured} is left out: {self.refused}. Nothing "
                              "was read or written there; put the folder back as it was")
        return SkillError(f"the folder {self.configured} does not exist")

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
    # (device, inode) of the read-only folders: a write is refused in one met on the way below a
    # writable folder, however it got there (a command may move it after its path was checked).
    read_only: frozenset[tuple[int, int]] = frozenset()

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


class Folders:
    """The principal's folders, open for one call (see open_folders); close() when done."""

    def __init__(self, principal: Principal, grants: Grants) -> None:
        self.grants = grants
        self.uid = principal.scope.uid
        opened = [grants.workspace, *grants.others]  # workspace, read_write, read_only: as file_roots
        configured = principal.file_roots()
        # A missing folder's path is only resolved for the wording: it is never opened.
        # A missing folder's path is only resolved for the wording, a refused one not even that
        # (it leads where a command pointed it): neither is ever opened.
        self.roots = [_Root(str(grant.path) if grant.fd is not None
                            else os.path.abspath(path) if grant.refused else _real(str(path)),
                            str(path), writable, index == 0, grant.fd, grant.refused)
                      for index, ((path, writable), grant) in enumerate(zip(configured, opened,
                                                                              strict=True))]

    @property
    def read_only(self) -> frozenset[tuple[int, int]]:
        """(device, inode) of the read-only folders that are not also writable ones."""
        def ids(writable: bool) -> set[tuple[int, int]]:
            return {_identity(os.fstat(root.fd)) for root in self.roots
                    if root.fd is not None and root.writable == writable}
        return frozenset(ids(False) - ids(True))

    def close(self) -> None:
        self.grants.close()

    def __enter__(self) -> Folders:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_folders(principal: Principal) -> Folders:
    """The workspace and granted folders of `principal`, opened as its shell commands' are
    (sandbox.grants, as the daemon: the admin's folders), or a SkillError saying why not. One that
    leads through a symlink inside a folder commands may write refuses the whole call, as it
    refuses every command: which folder a path lies in is only known with all of them."""
    try:
        with as_daemon():
            grants = Grants.of(principal.scope)
    except UnsafeGrant as exc:
        raise SkillError(f"refused to open your folders: {exc}. Nothing was read or written; an admin "
                         "must put the folder back (or take it out of the role) before the files "
                         "skill or commands use it again") from None
    except FileNotFoundError as exc:  # only the workspace: a missing granted folder is left open
        raise SkillError(f"your workspace {exc.filename} does not exist; ask the admin") from None
    except NotADirectoryError as exc:
        raise SkillError(f"{exc.filename} is not a folder; ask the admin to fix the role") from None
    try:
        return Folders(principal, grants)
    except BaseException:
        grants.close()
        raise


def folder_path(root: _Root) -> Path:
    """A path naming the folder open as root.fd itself (/proc's link to the descriptor), for code
    that takes a path (the disk budget's measures): the folder's own path may lead elsewhere by now."""
    if root.fd is None:
        raise root.unavailable()
    return Path(f"/proc/self/fd/{root.fd}")


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _listing(roots: list[_Root]) -> str:
    return ", ".join(root.shown() for root in roots)


def _root_of(path: str, roots: list[_Root]) -> _Root | None:
    """The innermost folder holding `path`: a read-only folder inside a writable one stays read-only
    (and a workspace inside a read-only folder stays writable)."""
    holding = [root for root in roots if _inside(path, root.real)]
    return max(holding, key=lambda root: len(root.real), default=None)


def resolve(raw: str, folders: Folders) -> Target:
    """Where `raw` leads: inside one of the principal's folders, or a SkillDenied saying how it
    leaves. The Target is good while `folders` is open."""
    roots = folders.roots
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
    return Target(raw, root, parts, uid=folders.uid, read_only=folders.read_only)


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


def _open_dir(target: Target, parts: tuple[str, ...], *, create: bool = False, hint: str = "",
              writing: bool = False) -> int:
    """A descriptor for the folder root/parts, every component opened with O_NOFOLLOW from the one
    above it. With `create`, missing folders are made (and given to the sandbox uid in a workspace
    when we are root, so the sandboxed shell can change what we made). `hint` is added when the last
    component turns out not to be a folder. `writing`: a read-only folder on the way is refused."""
    chown = create and target.root.workspace and os.geteuid() == 0
    guard = target.read_only if writing and target.root.writable else frozenset()
    if target.root.fd is None:
        raise target.root.unavailable()
    # The granted folder's descriptor (opened as the daemon: its parents are not the user's to
    # walk), opened again as whoever acts now: a descriptor opened as root would list a folder the
    # user may not read (reads through it are not checked again).
    fd = os.open(".", DIR_FLAGS, dir_fd=target.root.fd)
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
            if guard and _identity(os.fstat(fd)) in guard:
                raise SkillDenied(f"{q(target.raw)} is in {target.shown(where)}, which is read-only for "
                                  "you (one of your read-only folders, moved there)")
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


def open_file(target: Target, flags: int, *, create: bool = False) -> tuple[int, bool]:
    """(descriptor, whether we created the file) for the target file, through _open_dir."""
    if not target.parts:
        raise SkillError(f"{target.shown()} is a folder; use action \"list\"")
    parent = _open_dir(target, target.parts[:-1], create=create,
                       writing=bool(flags & (os.O_WRONLY | os.O_RDWR)))
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
