"""How much disk a folder tree takes, and how much room its filesystem has left: the two numbers
the workspace quota and the free-space reserve are checked against (sandbox.disk_budget).

Usage is what the files really hold on the disk (allocated blocks, not their apparent sizes: a
sparse file costs what it stores, a small file a whole block), each inode once, symlinks never
followed and mounts inside the folder (the admin's) never entered: what deleting the tree would
give back to its filesystem. Except that every inode costs at least INODE_CHARGE: an empty
file or a short symlink takes no block but one of the filesystem's inodes, of which there are a
fixed number (ext4: one per 16 KiB), and a quota that did not count them would let one user's
commands make millions of empty files and leave nobody able to create one, the store included.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sandbox.mounts import mounts

log = logging.getLogger(__name__)

MB = 1 << 20
BLOCK = 512  # st_blocks counts in these, whatever the filesystem's own block size
INODE_CHARGE = 4096  # the least a file, folder or link counts for: one block on most filesystems


# Folder descriptors one walk holds at most: the daemon's soft limit is often 1,024 for everything
# it has open (the store, sockets, commands' pipes), and a tree may be nested thousands deep.
MAX_HELD = 64
# Deeper than this the workspace is not measured, and its commands are refused.
MAX_DEPTH = 10_000
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Unmeasurable(Exception):
    """The tree cannot be measured (nested deeper than MAX_DEPTH, or the daemon out of
    descriptors); the message says why."""


def usage(folder: Path) -> int:
    """Bytes the tree under `folder` (itself included) holds on its filesystem, as charged (see
    the module's docstring). A tree that changes while it is walked is measured as found: what
    vanished or moved meanwhile is not counted (the next measure counts it).

    The walk goes by folder descriptors, never by path, so a tree nested past PATH_MAX is measured
    like any other, holding at most MAX_HELD descriptors; past MAX_DEPTH levels, or out of
    descriptors, it raises Unmeasurable rather than count less. A folder the daemon owns but may
    not list or enter it makes readable first: an unprivileged daemon runs the user's commands as
    its own uid, and a `chmod 000` or `chmod 400` must not hide what the folder holds. A folder
    that is not the daemon's and that it may not read is logged and skipped."""
    return _Walk(folder).total


@dataclass
class _Frame:
    """One folder on the way down from the top. No path: at 10,000 levels of 255-byte names the
    paths alone would take gigabytes."""

    fd: int | None  # None: closed to stay under MAX_HELD; re-opened by name from an ancestor
    name: str  # in its parent
    ident: tuple[int, int]  # (st_dev, st_ino): a re-opened folder must be the one left
    subfolders: list[str]  # not yet entered
    path: str | None  # only for a folder on the way to a mount point (the names below are checked)


class _Walk:
    """Depth first. The held descriptors are the top's and those of the deepest frames, from
    `self.low` to the end (at most MAX_HELD in all, counting scandir's duplicate and a re-open's
    O_PATH handle): going down closes the shallowest, going back up re-opens the parent through
    "..", one open a level, whatever the tree's shape."""

    def __init__(self, folder: Path) -> None:
        self.root = os.path.realpath(folder)
        self.mounts = {m for m in _mount_points() if m.startswith(self.root + "/")}
        self.toward_mounts = {self.root} | {up for m in self.mounts for up in _ancestors(m, self.root)}
        self.seen: set[tuple[int, int]] = set()  # files with more than one link, counted once
        self.frames: list[_Frame] = []
        self.low = 1  # the shallowest held frame but the top's
        self.total = 0
        try:
            self._enter(_resourceful(_open_listable, None, os.fspath(folder)), "", self.root)
            while self.frames:
                frame = self.frames[-1]
                if not frame.subfolders:
                    self._leave()
                    continue
                name = frame.subfolders.pop()
                parent = self._descriptor()
                if parent is None:  # moved away meanwhile: its rest is not counted this time
                    frame.subfolders.clear()
                    continue
                child = self._open(parent, name)
                if child is None:
                    continue
                if len(self.frames) >= MAX_DEPTH:
                    os.close(child)
                    raise Unmeasurable(f"its folders are nested more than {MAX_DEPTH:,} deep")
                path = f"{frame.path}/{name}" if frame.path is not None else None
                self._enter(child, name, path if path in self.toward_mounts else None)
        finally:
            for frame in self.frames:
                if frame.fd is not None:
                    os.close(frame.fd)

    def _enter(self, fd: int, name: str, path: str | None) -> None:
        """Count what the folder `fd` holds (and, for the top, the folder itself) and go in."""
        try:
            st = os.fstat(fd)
            if not self.frames:
                self.total += charge(st)
            subfolders = self._scan(fd, path)
        except BaseException:
            os.close(fd)
            raise
        self.frames.append(_Frame(fd, name, (st.st_dev, st.st_ino), subfolders, path))
        self._trim()

    def _scan(self, fd: int, path: str | None) -> list[str]:
        subfolders, unreadable = [], None
        with _resourceful(os.scandir, fd) as entries:  # on a duplicate: fd stays ours
            for entry in entries:
                if path is not None and f"{path}/{entry.name}" in self.mounts:
                    continue  # a mount point (a folder or a file): another filesystem's, or counted there
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # gone meanwhile
                    continue
                except OSError as exc:  # in a folder not the daemon's, which it could not make readable
                    unreadable = exc
                    continue
                is_dir = stat.S_ISDIR(st.st_mode)
                if st.st_nlink > 1 and not is_dir:
                    # By device too: each btrfs subvolume numbers its inodes from 256.
                    if (st.st_dev, st.st_ino) in self.seen:
                        continue
                    self.seen.add((st.st_dev, st.st_ino))
                self.total += charge(st)
                if is_dir:
                    subfolders.append(entry.name)
        if unreadable is not None:
            log.warning("the disk budget cannot measure all of a folder at depth %d in %s: %s",
                        len(self.frames), self.root, unreadable)
        return subfolders

    def _open(self, parent: int, name: str) -> int | None:
        """_open_listable, or None (logged if it is not merely gone) for a folder to skip; out of
        descriptors (or memory) is Unmeasurable: running out must never count as less."""
        try:
            return _resourceful(_open_listable, parent, name)
        except (FileNotFoundError, NotADirectoryError):  # gone, or swapped for something else
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # ELOOP: a symlink swapped in, never followed
                log.warning("the disk budget cannot measure a folder at depth %d in %s: %s",
                            len(self.frames), self.root, exc)
            return None

    def _trim(self) -> None:
        """Close the shallowest held descriptors (never the top's) while more are held than
        MAX_HELD less the two a step may add (scandir's duplicate, an O_PATH handle)."""
        while len(self.frames) - self.low > MAX_HELD - 3:
            frame = self.frames[self.low]
            os.close(frame.fd)
            frame.fd = None
            self.low += 1

    def _leave(self) -> None:
        """Pop the deepest frame; its parent, if closed, is re-opened through ".." (checked to be
        the folder left) before the child's descriptor goes."""
        frame = self.frames.pop()
        try:
            parent = self.frames[-1] if self.frames else None
            if parent is not None and parent.fd is None and frame.fd is not None:
                with contextlib.suppress(OSError):  # but Unmeasurable; else by name (_descriptor)
                    up = _resourceful(_open_listable, frame.fd, "..")
                    try:
                        st = os.fstat(up)
                    except BaseException:
                        os.close(up)
                        raise
                    if (st.st_dev, st.st_ino) == parent.ident:
                        parent.fd, self.low = up, len(self.frames) - 1
                    else:  # moved meanwhile: re-opened by name, or skipped
                        os.close(up)
        finally:
            if frame.fd is not None:
                os.close(frame.fd)
        self.low = min(self.low, len(self.frames))

    def _descriptor(self) -> int | None:
        """The deepest frame's descriptor; if ".." could not give it back, re-opened by name from
        its nearest held ancestor. None when a folder on the way is gone or is no longer the one
        left."""
        last = self.frames[-1]
        if last.fd is not None:
            return last.fd
        start = max(i for i in range(len(self.frames)) if self.frames[i].fd is not None)
        fd = self.frames[start].fd
        if start == 0:  # else frames low..start are still held, from a re-open that stopped short
            self.low = 1
        for index in range(start + 1, len(self.frames)):
            frame = self.frames[index]
            child = self._open(fd, frame.name)
            if child is None:
                return None
            st = os.fstat(child)
            if (st.st_dev, st.st_ino) != frame.ident:  # renamed meanwhile, another put there
                os.close(child)
                return None
            frame.fd = fd = child
            if index + 1 - self.low > MAX_HELD - 3:  # the frames below `index` are not open yet
                shallowest = self.frames[self.low]
                os.close(shallowest.fd)
                shallowest.fd = None
                self.low += 1
        return fd


def _resourceful(call, *args, **kwargs):
    """`call(...)`, with running out of descriptors or memory raised as Unmeasurable: it must
    never count as a folder skipped."""
    try:
        return call(*args, **kwargs)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            raise Unmeasurable(f"the daemon ran out of descriptors measuring it ({exc})") from None
        raise


def _ancestors(path: str, root: str) -> set[str]:
    """The folders from `root` down to `path`'s parent."""
    found = set()
    while len(path) > len(root):
        path = os.path.dirname(path)
        found.add(path)
    return found


def _open_listable(parent: int | None, name: str) -> int:
    """A descriptor to list the folder `name` of `parent` (the top: `name` is a path, symlinks
    followed, the admin's), made listable and enterable first if it is the daemon's and is not.
    The mode is changed through the folder's own O_PATH descriptor, never a name: a folder swapped
    for a symlink meanwhile is found as the symlink (ELOOP or ENOTDIR), and nothing it points to is
    touched (and glibc before 2.32 refuses fchmodat's no-follow flag)."""
    follow = os.O_NOFOLLOW if parent is not None else 0
    handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC | follow, dir_fd=parent)
    try:
        st = os.fstat(handle)
        wanted = stat.S_IRUSR | stat.S_IXUSR
        if st.st_uid == os.geteuid() and st.st_mode & wanted != wanted:
            try:
                os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(st.st_mode) | wanted)
            except OSError as exc:  # no /proc here, say: a locked folder must not pass as gone
                raise Unmeasurable(f"a folder locked against the daemon cannot be unlocked ({exc})") \
                    from None
        return os.open(".", _DIR, dir_fd=handle)
    finally:
        os.close(handle)


def _mount_points() -> frozenset[str]:
    """Every mount point this process sees. Not st_dev: a btrfs subvolume, which any user may
    create in a folder of theirs, has a device number of its own too."""
    return frozenset(mount.point for mount in mounts())


def charge(st: os.stat_result) -> int:
    """What one inode counts for in `usage`: its allocated blocks, and at least INODE_CHARGE."""
    return max(st.st_blocks * BLOCK, INODE_CHARGE)


def free_space(path: Path) -> tuple[int, int]:
    """(free bytes, room) of `path`'s filesystem, from one statvfs. Free bytes: what an
    unprivileged writer can still put there (root's reserved blocks, which only root may fill, are
    not counted: the sandbox never writes as root). Room: free bytes plus INODE_CHARGE per free
    inode, which falls by at least as much as the `usage` of a tree there grows, whether blocks or
    inodes are spent (a filesystem that counts no inodes, like btrfs, adds a constant)."""
    vfs = os.statvfs(path)
    free = vfs.f_bavail * vfs.f_frsize
    return free, free + vfs.f_favail * INODE_CHARGE


def free_bytes(path: Path) -> int:
    return free_space(path)[0]


def device(path: Path) -> int:
    """The filesystem `path` is on, so each filesystem is watched once however many folders share it."""
    return os.stat(path).st_dev


def megabytes(size: int) -> str:
    """A size in the config keys' unit (disk_mb, min_free_disk_mb): "1,024 MB" for a whole number of
    them (what the config set), else to a tenth, rounded down ("2.0 MB", "1,023.9 MB free"); under
    one, in bytes."""
    if size % MB == 0:
        return f"{size // MB:,} MB"
    if abs(size) < MB:
        return f"{size:,} bytes"
    return f"{size * 10 // MB / 10:,.1f} MB"
