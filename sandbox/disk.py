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

import logging
import os
import re
import stat
from pathlib import Path

log = logging.getLogger(__name__)

MB = 1 << 20
BLOCK = 512  # st_blocks counts in these, whatever the filesystem's own block size
INODE_CHARGE = 4096  # the least a file, folder or link counts for: one block on most filesystems


def usage(folder: Path) -> int:
    """Bytes the tree under `folder` (itself included) holds on its filesystem, as charged (see
    the module's docstring). A tree that changes while it is walked is measured as found: what
    vanished meanwhile is not counted.

    The walk goes by folder descriptors, never by path, so a tree nested past PATH_MAX is measured
    like any other (by path it raised ENAMETOOLONG, and every later command failed with it). A
    folder the walk may not read, it makes readable when the daemon owns it: an unprivileged
    daemon runs the user's commands as its own uid, and a `chmod 000` must not hide what the folder
    holds. What still cannot be read (not the daemon's, or more open folders than it may hold) is
    counted as far as it was reached, and logged."""
    mounts = _mount_points()
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    seen: set[int] = set()  # inodes with more than one link, so each is counted once
    total = charge(os.fstat(top))
    # One frame per folder on the way down: its descriptor, its path (only to name mount points
    # and log lines), and its subfolders not yet entered. Descriptors held: the depth.
    frames: list[tuple[int, str, list[str]]] = []

    def enter(fd: int, path: str) -> None:
        nonlocal total
        subfolders = []
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # gone meanwhile
                    continue
                is_dir = stat.S_ISDIR(st.st_mode)
                if is_dir and f"{path}/{entry.name}" in mounts:
                    continue  # a mount point: its files are another filesystem's (or counted there)
                if st.st_nlink > 1 and not is_dir:
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += charge(st)
                if is_dir:
                    subfolders.append(entry.name)
        frames.append((fd, path, subfolders))

    try:
        enter(top, os.path.realpath(folder))
        while frames:
            fd, path, subfolders = frames[-1]
            if not subfolders:
                os.close(fd)
                frames.pop()
                continue
            name = subfolders.pop()
            child = _open_folder(fd, name, f"{path}/{name}")
            if child is not None:
                try:
                    enter(child, f"{path}/{name}")
                except OSError as exc:
                    os.close(child)
                    log.warning("the disk budget cannot measure %s/%s: %s", path, name, exc)
    finally:
        for fd, _, _ in frames:
            os.close(fd)
    return total


def _open_folder(parent: int, name: str, path: str) -> int | None:
    """A descriptor for the subfolder `name` of `parent`, made readable first if it is the
    daemon's and is not; None (logged) if it cannot be opened or is gone."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        return None
    except PermissionError:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if st.st_uid != os.geteuid():
                raise
            os.chmod(name, stat.S_IMODE(st.st_mode) | stat.S_IRUSR | stat.S_IXUSR, dir_fd=parent,
                     follow_symlinks=False)
            return os.open(name, flags, dir_fd=parent)
        except OSError as exc:
            log.warning("the disk budget cannot measure %s: %s", path, exc)
            return None
    except OSError as exc:  # EMFILE at a depth of thousands of folders, ELOOP: a symlink swapped in
        log.warning("the disk budget cannot measure %s: %s", path, exc)
        return None


def _mount_points() -> frozenset[str]:
    """Every mount point this process sees (/proc/self/mountinfo's fifth field, whose spaces,
    tabs, newlines and backslashes are written as octal escapes). Not st_dev: a btrfs subvolume,
    which any user may create in a folder of theirs, has a device number of its own too."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
            fields = [line.split(" ")[4] for line in table if line.count(" ") >= 4]
    except OSError:
        return frozenset()
    return frozenset(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f) for f in fields)


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
