"""What a user's commands and file writes may still put on disk, so that one user cannot fill it
(and break the store every user's conversations live in).

Two rules. A role's workspace quota (`disk_mb`; 0: none) bounds what the user's workspace holds.
A global reserve (`[sandbox] min_free_disk_mb`; 0: none) is free space no command or write may
take, on every filesystem a command can write (its workspace, its role's read-write folders) and
on the daemon's data folder's.

Before a command starts the workspace is measured once (sandbox.disk, a walk of the tree) and the
free space of each filesystem read; the command is refused (DiskFull) when the workspace is already
at its quota or a filesystem under the reserve. While it runs only statvfs is read, a few times a
second: the walk comes again only when the workspace's filesystem has lost more room (free bytes,
and disk.INODE_CHARGE per inode taken) than the user had left, because other users' writes lower it
too, and nobody is stopped on that estimate alone. A filesystem under the reserve stops the command
whoever filled it: the reserve protects the store, whatever ate into it. Space others free while a
command runs can hide as much of its writing from the watch; the next command's measure counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from sandbox import disk
from sandbox.disk import megabytes

log = logging.getLogger(__name__)

# How often a running command's filesystems are looked at (one statvfs each, about 2 us, in a
# worker thread). What a command can write between two looks is its overshoot (fallocate, which
# could reserve gigabytes at once, is refused by the seccomp filter).
POLL_S = 0.1
RESERVE_KEY = "[sandbox] min_free_disk_mb"
QUOTA_KEY = "the role's disk_mb"


class DiskFull(Exception):
    """A command or a write refused: the workspace is at its quota, or a filesystem it would
    write is under the reserve. The message says which, with the numbers, for the model and user."""


@dataclass
class _Watched:
    """One filesystem a command can write or the reserve protects."""

    label: str  # what a message calls it: the workspace, a granted folder, the daemon's data
    path: Path  # a folder on it, for statvfs
    free: int  # its free bytes when first looked at
    baseline: int  # its room (disk.free_space) when the workspace was last measured
    holds_workspace: bool


def _workspace_full(used: int, quota: int) -> str:
    return (f"the workspace is full: {megabytes(used)} used of its {megabytes(quota)} quota "
            f"({QUOTA_KEY}); delete files to make room")


def _under_reserve(label: str, free: int, reserve: int) -> str:
    return (f"the disk holding {label} is nearly full: {megabytes(free)} free, under the "
            f"{megabytes(reserve)} kept free for everyone ({RESERVE_KEY}); delete files to make "
            "room, or ask the admin")


class CommandWatch:
    """One command's disk budget: measured, and refused with DiskFull, when made (before the
    command starts); `overrun` then watches it while it runs, and `after` looks once more when it
    and its processes are gone.

    Only the measures before and after are exact. One taken while the command runs races it: a
    folder renamed at the right moment, or locked again as an unprivileged daemon unlocks it, is
    missed, so the watch may let a command run past its quota (never past the reserve, read by
    statvfs). `after` then measures again, from the room the command started with, whatever the
    walks in between concluded; the command is reported and the next one refused."""

    def __init__(self, workspace: Path, writable: tuple[Path, ...], protected: tuple[Path, ...], *,
                 quota: int, reserve: int) -> None:
        self.workspace, self.quota, self.reserve = workspace, quota, reserve
        self._watched, used = _measure(workspace, writable, protected, quota=quota, reserve=reserve)
        self._allowance = quota - used  # what the command may still add to the workspace
        self._start = (self._allowance, {id(fs): fs.baseline for fs in self._watched})

    def after(self) -> str | None:
        """Once the command's processes are gone (nothing races the walk now): why it went over its
        budget, or None. The workspace is walked when its filesystem lost more room since the
        start than the command was allowed, however the walks while it ran had reset that."""
        allowance, baselines = self._start
        self._allowance = allowance
        for fs in self._watched:
            fs.baseline = baselines[id(fs)]
        return self.check()

    @property
    def active(self) -> bool:
        """Whether there is anything to watch (no quota and no reserve: nothing)."""
        return bool(self._watched)

    def check(self) -> str | None:
        """One look (blocking: statvfs, and on the rare trigger the walk): why the command must
        be stopped now, or None."""
        for fs in self._watched:
            try:
                free, room = disk.free_space(fs.path)
            except OSError:  # its folder removed meanwhile (by this command, say): nothing to look at
                continue
            if self.reserve and free < self.reserve:
                return (f"free space on the disk holding {fs.label} fell to {megabytes(free)}, under "
                        f"the {megabytes(self.reserve)} kept free for everyone ({RESERVE_KEY})")
            if fs.holds_workspace and self.quota and fs.baseline - room > self._allowance:
                try:
                    used = _measured(self.workspace)
                except DiskFull as exc:
                    return str(exc)
                except OSError as exc:  # the workspace itself gone or replaced: the next look retries
                    log.warning("cannot measure %s: %s", self.workspace, exc)
                    continue
                if used > self.quota:
                    return (f"the workspace went over its {megabytes(self.quota)} disk quota "
                            f"({megabytes(used)} used; {QUOTA_KEY})")
                # Others wrote it: start again from here, so the walk is not repeated every poll.
                log.debug("%s lost %d bytes of room, but holds %d of its %d: not over",
                          self.workspace, fs.baseline - room, used, self.quota)
                fs.baseline, self._allowance = room, self.quota - used
        return None

    async def overrun(self) -> str:
        """Returns only when the command must be stopped, saying why; cancel it when the command
        ends. The looks run in a worker thread: a slow filesystem must not stall the daemon."""
        while True:
            await asyncio.sleep(POLL_S)
            if why := await asyncio.to_thread(self.check):
                return why


def check_room(workspace: Path, protected: tuple[Path, ...], *, quota: int, reserve: int) -> None:
    """Before files the user sent are saved into `workspace`: DiskFull when it is at its quota or
    its filesystem, or one of `protected`'s, under the reserve (blocking: a walk)."""
    _measure(workspace, (), protected, quota=quota, reserve=reserve)


def _measure(workspace: Path, writable: tuple[Path, ...], protected: tuple[Path, ...], *,
             quota: int, reserve: int) -> tuple[list[_Watched], int]:
    """(the filesystems to watch, the workspace's usage; 0 without a quota), or DiskFull when the
    workspace is at its quota or one of the filesystems under the reserve."""
    folders = [(workspace, "your workspace"), *((p, str(p)) for p in writable),
               *((p, "the daemon's data") for p in protected)]
    watched = _filesystems(folders) if quota or reserve else []
    for fs in watched:
        if reserve and fs.free < reserve:
            raise DiskFull(_under_reserve(fs.label, fs.free, reserve))
    # Measured after the free space is read: writes meanwhile then count twice, never not at all.
    used = _measured(workspace) if quota else 0
    if quota and used >= quota:
        raise DiskFull(_workspace_full(used, quota))
    return watched, used


def _measured(workspace: Path) -> int:
    """disk.usage; a tree it cannot measure is refused (DiskFull), never let through."""
    try:
        return disk.usage(workspace)
    except disk.Unmeasurable as exc:
        raise DiskFull(f"the workspace cannot be measured: {exc}; ask the admin") from None


def _filesystems(folders: list[tuple[Path, str]]) -> list[_Watched]:
    """Each filesystem once, named after its first folder (the workspace comes first). A folder
    that does not exist is skipped: nothing can be written there (bwrap refuses to bind it)."""
    found: dict[int, _Watched] = {}
    for index, (path, label) in enumerate(folders):
        with contextlib.suppress(OSError):
            dev = disk.device(path)
            if dev not in found:
                found[dev] = _Watched(label, path, *disk.free_space(path), index == 0)
    return list(found.values())


def check_write(folder: Path, growth: int, *, workspace: Path | None, quota: int, reserve: int) -> None:
    """Before the files skill adds `growth` bytes (negative: frees some) to a file in `folder`:
    DiskFull when the write would take `workspace` (None: the folder is not in it) over its quota,
    or the folder's filesystem under the reserve. A write that frees space is never refused."""
    if growth <= 0:
        return
    if reserve:
        free = disk.free_bytes(folder)
        if free - growth < reserve:
            raise DiskFull(_under_reserve("this folder" if workspace is None else "your workspace",
                                          free, reserve))
    if workspace is not None and quota:
        used = _measured(workspace)
        if used + growth > quota:
            raise DiskFull(f"the workspace would go over its {megabytes(quota)} quota: "
                           f"{megabytes(used)} used, and this adds {growth:,} bytes "
                           f"({QUOTA_KEY}); delete files to make room")
