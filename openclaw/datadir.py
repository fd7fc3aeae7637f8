"""Claiming the data_dir: one daemon (or one command that changes the store under it) at a time,
who holds it now, and keeping the folder its owner's alone."""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

log = logging.getLogger(__name__)

# The word after the pid in the lock file of a daemon that re-reads its config on SIGHUP.
RELOADS = "reloads"


class DaemonRunning(RuntimeError):
    """Another daemon already serves this data_dir (its store, its console, its replies)."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"{holder}; stop it first, or use `openclaw chat` to talk to it")
        self.holder = holder


@dataclass(frozen=True)
class Holder:
    pid: int
    reloads: bool  # SIGHUP re-reads its config (`openclaw run`); else it would stop or die


def lock_holder(data_dir: Path) -> Holder | None:
    """The process holding data_dir's lock now: the pid its lock file names, confirmed in the
    kernel's table of locks (/proc/locks), so that a signal meant for the daemon never reaches a
    process that merely reuses the pid of one gone since. PermissionError when data_dir is not
    ours to read (a daemon of another user)."""
    path = data_dir / "daemon.lock"
    try:
        words = path.read_text().split()
        pid, inode = int(words[0]), os.stat(path).st_ino
        with open("/proc/locks") as table:
            lines = table.readlines()
    except PermissionError:
        raise
    except (OSError, ValueError, IndexError):  # no file, or no pid in it: nobody holds it
        return None
    # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146588 0 EOF"; waiters have "->" in field 1. Only
    # the inode is compared: on btrfs the device number differs from the one stat gives.
    for fields in map(str.split, lines):
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4] == str(pid) \
                and fields[5].rpartition(":")[2] == str(inode):
            return Holder(pid, RELOADS in words[1:])
    return None


def data_dir_claimed(data_dir: Path) -> bool:
    """Whether a process holds data_dir now (see lock_holder). Not by trying the lock: a try
    would hold it for an instant, and a daemon starting in that instant would be refused."""
    try:
        return lock_holder(data_dir) is not None
    except PermissionError:  # a folder not ours to read: another user's daemon keeps it
        return True


def claim_data_dir(data_dir: Path, reloads: bool = False) -> TextIO:
    """Hold data_dir for this process: two daemons on one store would each answer the other's
    messages and send each other's pending replies. The kernel drops the lock if we die."""
    lock = open(data_dir / "daemon.lock", "a+")  # noqa: SIM115 -- held until release_data_dir
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = (lock.read().split() or ["?"])[0]
        lock.close()
        raise DaemonRunning(f"another openclaw daemon (pid {holder}) is running with data_dir "
                            f"{data_dir}") from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}{' ' + RELOADS if reloads else ''}\n")
    lock.flush()
    return lock


def release_data_dir(lock: TextIO) -> None:
    """Give back what claim_data_dir took: no pid left in the file (nobody holds it, as
    data_dir_claimed reads it), then the lock."""
    lock.truncate(0)
    lock.close()


def keep_private(data_dir: Path) -> None:
    """data_dir holds every conversation: a folder of ours that others may enter (made by an
    older version, or by hand) is made the owner's alone, and the log says so."""
    st = data_dir.stat()
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        data_dir.chmod(0o700)
        log.warning("%s was open to other users (mode %o); it is now 0700, as it holds every "
                    "conversation", data_dir, st.st_mode & 0o777)
