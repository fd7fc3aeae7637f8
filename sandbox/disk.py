"""How much disk a folder tree takes, and how much room its filesystem has left: the two numbers
the workspace quota and the free-space reserve are checked against (sandbox.disk_budget).

Usage is what the files really hold on the disk (allocated blocks, not their apparent sizes: a
sparse file costs what it stores, a small file a whole block), each inode once, symlinks never
followed and other filesystems (a mount inside the folder) never entered: what deleting the tree
would give back to its filesystem. Except that every inode costs at least INODE_CHARGE: an empty
file or a short symlink takes no block but one of the filesystem's inodes, of which there are a
fixed number (ext4: one per 16 KiB), and a quota that did not count them would let one user's
commands make millions of empty files and leave nobody able to create one, the store included.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

MB = 1 << 20
BLOCK = 512  # st_blocks counts in these, whatever the filesystem's own block size
INODE_CHARGE = 4096  # the least a file, folder or link counts for: one block on most filesystems


def usage(folder: Path) -> int:
    """Bytes the tree under `folder` (itself included) holds on its filesystem. A tree that changes
    while it is walked is measured as found: what vanished meanwhile is not counted, and what the
    walk cannot open (a folder nobody may read) counts only its own blocks."""
    top = os.lstat(folder)
    seen: set[int] = set()  # inodes with more than one link, so each is counted once
    total = charge(top)
    pending = [os.fspath(folder)]
    while pending:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, PermissionError), \
                os.scandir(pending.pop()) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_dev != top.st_dev:
                    continue  # a mount point: its files are another filesystem's
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += charge(st)
                if stat.S_ISDIR(st.st_mode):
                    pending.append(entry.path)
    return total


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
