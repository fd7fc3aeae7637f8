"""A memory cgroup for each sandboxed command, so that the command's memory is bounded as a whole.

RLIMIT_AS bounds each process's address space, and nothing else: a command's processes together
(up to the role's `processes`), SysV shared memory, memfds written and kept open, and the pages of
its tmpfs /tmp are charged to no rlimit, and could run the host, with the daemon and its model,
out of memory. A cgroup charges all of them to the command: at the role's `memory_mb`, the kernel
reclaims, then kills inside the cgroup, never outside it.

Where: under the daemon's own cgroup, read from /proc/self/cgroup.
- cgroup v2 (unified; modern distributions): the daemon's cgroup must be delegated to it, and the
  memory controller offered there: `Delegate=memory` in the systemd unit (`openclaw service install`
  writes it). A cgroup that holds processes cannot give its children controllers, so the daemon
  first moves itself into a leaf of its own (`daemon`), when it is the only process there.
- cgroup v1: the memory controller's hierarchy, where the daemon (as root) may create cgroups.
Without either (an unprivileged daemon in a terminal's session, say) commands still run, bounded
per process only; `available()` says why, and `openclaw doctor` shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from sandbox.mounts import mounts
from sandbox.to_end import run_to_end

log = logging.getLogger(__name__)

PREFIX = "openclaw-cmd-"  # the cgroups of commands; one left by a crashed daemon is removed later
DAEMON_LEAF = "daemon"  # cgroup v2: where the daemon moves itself, so its cgroup may have children
REMOVE_WAIT_S = 2.0  # for the kernel to let go of a cgroup whose last process just died

_counter = itertools.count()


@dataclass(frozen=True)
class Place:
    """Where commands' cgroups are made: `root`, on a hierarchy of cgroup `version` 1 or 2."""

    version: int
    root: Path


@dataclass(frozen=True)
class CommandGroup:
    """One command's cgroup. `procs_path` is written by the command's first process, between fork
    and exec (join), so that everything it starts is charged here."""

    place: Place
    path: Path

    @property
    def procs_path(self) -> bytes:
        return os.fsencode(self.path / "cgroup.procs")

    def out_of_memory(self) -> bool:
        """Whether the kernel killed one of its processes for the limit."""
        name = "memory.events" if self.place.version == 2 else "memory.oom_control"
        try:
            fields = dict(line.split() for line in (self.path / name).read_text().splitlines())
        except (OSError, ValueError):
            return False
        return int(fields.get("oom_kill", "0")) > 0

    def remove(self) -> None:
        """Kill what is left in it (the runner has killed the command's pid namespace already;
        this is the backstop) and remove it. Never raises: a cgroup left behind is removed at the
        daemon's next start, and costs nothing meanwhile."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            _kill_all(self.path, self.place.version)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.warning("cannot remove the command's cgroup %s: %s", self.path, exc)
                    return
            time.sleep(0.01)


@contextlib.asynccontextmanager
async def command_group(memory_bytes: int) -> AsyncIterator[CommandGroup | None]:
    """A cgroup for one command, removed when the block is left (however: also when cancelled),
    or None where there are none. One that cannot be made is logged, and the command runs bounded
    per process, as where cgroups are not available: it was there a moment ago, and a command
    refused for a passing error (EAGAIN, ENOMEM) would be a worse default than one per-process
    bounded."""
    try:
        # In a thread that goes on if we are cancelled: what it made then is removed at once.
        group = await run_to_end(asyncio.to_thread(default.create, memory_bytes),
                                 lambda made: made and made.remove())
    except OSError as exc:
        log.warning("no memory cgroup for this command (its memory is bounded per process "
                    "only): %s", exc)
        group = None
    try:
        yield group
    finally:
        if group is not None:  # in a thread: it may wait for the last processes to go
            await asyncio.shield(asyncio.to_thread(group.remove))


def join(procs_path: bytes) -> None:
    """Runs in the command's first process, between fork and exec: move it into its cgroup. Bare
    system calls: the rlimits set after this leave room for little else. Raises OSError; the
    child then fails to start, and the runner reports it, rather than running unbounded."""
    fd = os.open(procs_path, os.O_WRONLY)
    try:
        os.write(fd, b"0")  # 0: the writing process itself
    finally:
        os.close(fd)


class Cgroups:
    """The daemon's place for commands' cgroups, found once, on first use (blocking: files)."""

    def __init__(self) -> None:
        self._found: tuple[Place | None, str] | None = None

    def available(self) -> tuple[Place | None, str]:
        """(where commands' cgroups go, how it was found), or (None, why there is none)."""
        if self._found is None:
            self._found = _locate()
            place, why = self._found
            if place is not None:
                _remove_stale(place)
            log.info("commands' memory cgroups: %s", why)
        return self._found

    def create(self, memory_bytes: int) -> CommandGroup | None:
        """A new cgroup for one command, its memory (swap included) bounded at `memory_bytes`;
        None where cgroups are not available. OSError when one cannot be made or set."""
        place, _ = self.available()
        if place is None:
            return None
        path = place.root / f"{PREFIX}{os.getpid()}-{next(_counter)}"
        path.mkdir()
        group = CommandGroup(place, path)
        try:
            _set_memory(group, memory_bytes)
        except OSError:
            group.remove()
            raise
        return group


default = Cgroups()  # the daemon's: its place is found once, at the first command


def _set_memory(group: CommandGroup, memory_bytes: int) -> None:
    path, limit = group.path, str(memory_bytes)
    if group.place.version == 2:
        (path / "memory.max").write_text(limit)
        # Swap would let it go past the limit, at the speed of the host's disk.
        with contextlib.suppress(FileNotFoundError):
            (path / "memory.swap.max").write_text("0")
        # One process killed for memory ends all of them: a half-killed command is no use.
        with contextlib.suppress(FileNotFoundError):
            (path / "memory.oom.group").write_text("1")
    else:
        (path / "memory.limit_in_bytes").write_text(limit)
        with contextlib.suppress(FileNotFoundError):  # a kernel without swap accounting
            (path / "memory.memsw.limit_in_bytes").write_text(limit)


def describe(found: tuple[Place | None, str]) -> str:
    """How commands' memory is bounded, in a line, from what available() or probe() found."""
    place, why = found
    return (f"all of a command's processes together, by a memory cgroup ({why})" if place
            else f"per process only (RLIMIT_AS), no memory cgroup: {why}")


def probe() -> tuple[Place | None, str]:
    """Cgroups.available() as this process would find them, changing nothing (`openclaw doctor`:
    on cgroup v2, its cgroup is not the service's)."""
    return _locate(settle=False)


def _locate(settle: bool = True) -> tuple[Place | None, str]:
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup: {exc}"
    own = {}  # controller ("" for v2) -> the daemon's cgroup path on its hierarchy
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    table = mounts()
    v2 = next((Path(m.point) for m in table if m.fstype == "cgroup2"), None)
    v1_memory = next((Path(m.point) for m in table if m.fstype == "cgroup" and "memory" in m.options),
                     None)
    problems = []
    if v2 is not None and "" in own:
        place, why = _v2_place(v2 / own[""].lstrip("/"), settle, ns_root=own[""] == "/")
        if place is not None:
            return place, why
        problems.append(why)
    if v1_memory is not None and "memory" in own:
        root = v1_memory / own["memory"].lstrip("/")
        if os.access(root, os.W_OK):
            return Place(1, root), f"cgroup v1 memory controller, under {root}"
        problems.append(f"cgroup v1: {root} is not writable (the daemon is not root)")
    return None, "; ".join(problems) or "no cgroup hierarchy with a memory controller is mounted"


def _v2_place(cgroup: Path, settle: bool, ns_root: bool = False) -> tuple[Place | None, str]:
    """The daemon's v2 cgroup, made a parent with the memory controller for its children: its
    own processes (only the daemon may be there) move into the leaf DAEMON_LEAF first. Without
    `settle`, only whether it is delegated. `ns_root`: it is the root of our cgroup namespace."""
    try:
        offered = (cgroup / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return None, f"cgroup v2: cannot read {cgroup}: {exc}"
    if "memory" not in offered:
        return None, (f"cgroup v2: the memory controller is not delegated to {cgroup} (run the "
                      "daemon as a systemd service with Delegate=memory: `openclaw service install`)")
    if not (ns_root or _marked_delegated(cgroup) or _handed_to_us(cgroup)):
        return None, (f"cgroup v2: {cgroup} is not delegated (no trusted.delegate or user.delegate "
                      "mark from systemd): the daemon's unit needs Delegate=memory (`openclaw "
                      "service install`)")
    if not os.access(cgroup / "cgroup.subtree_control", os.W_OK):
        return None, (f"cgroup v2: {cgroup} is not delegated to the daemon's user (Delegate=memory "
                      "in the systemd unit: `openclaw service install`)")
    if not settle:
        return Place(2, cgroup), f"cgroup v2, under {cgroup} (delegated)"
    try:
        if "memory" not in (cgroup / "cgroup.subtree_control").read_text().split():
            _leave_for_leaf(cgroup)
            (cgroup / "cgroup.subtree_control").write_text("+memory")
    except (OSError, _Shared) as exc:
        return None, f"cgroup v2: cannot give {cgroup}'s children the memory controller: {exc}"
    return Place(2, cgroup), f"cgroup v2, under {cgroup}"


def _marked_delegated(cgroup: Path) -> bool:
    """Whether systemd marked `cgroup` as delegated (Delegate= in its unit): trusted.delegate, read
    by root, or user.delegate, set by newer versions for unprivileged readers and by a user
    manager. Write access says nothing: root has it on every cgroup, and a user on every cgroup of
    its user manager, delegated or not. On a cgroup systemd has not delegated, it rewrites
    cgroup.subtree_control when it next realizes the unit, and `-memory` there silently takes
    the memory limit off every command's cgroup below (CGROUP_DELEGATION.md: never create
    cgroups below a unit without Delegate=)."""
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(cgroup, name).rstrip(b"\0").strip() == b"1":
                return True
        except OSError:  # not set, or trusted.* unreadable to an unprivileged daemon
            continue
    return False


def _handed_to_us(cgroup: Path) -> bool:
    """Whether `cgroup` is ours and its parent is not: how a system unit's cgroup is delegated to
    its User= (the kernel's model of delegation), where the daemon cannot read trusted.delegate and
    an older systemd sets no user.delegate. Never for root, who owns every cgroup; never below a
    user manager, whose every cgroup is its user's."""
    euid = os.geteuid()
    try:
        return euid != 0 and cgroup.stat().st_uid == euid and cgroup.parent.stat().st_uid != euid
    except OSError:
        return False


class _Shared(Exception):
    """Other processes share the daemon's cgroup: moving them is not ours to do."""


def _leave_for_leaf(cgroup: Path) -> None:
    """Move the daemon (the only process of `cgroup`) into `cgroup`/DAEMON_LEAF."""
    mine = str(os.getpid())
    procs = (cgroup / "cgroup.procs").read_text().split()
    if not procs:
        return
    if procs != [mine]:
        raise _Shared(f"processes other than the daemon are in it ({len(procs)} in all)")
    leaf = cgroup / DAEMON_LEAF
    leaf.mkdir(exist_ok=True)
    (leaf / "cgroup.procs").write_text(mine)


def _remove_stale(place: Place) -> None:
    """Commands' cgroups of a daemon that is gone (crashed, killed): removed, what is left in them
    killed first. Another daemon's, sharing this cgroup (two data folders, one service), are its
    own: their names carry the pid of the daemon that made them."""
    with contextlib.suppress(OSError):
        for entry in place.root.iterdir():
            owner = entry.name.removeprefix(PREFIX).partition("-")[0]
            if entry.name.startswith(PREFIX) and owner.isdigit() and not _alive(int(owner)):
                CommandGroup(place, entry).remove()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _kill_all(path: Path, version: int) -> None:
    if version == 2:
        with contextlib.suppress(OSError):  # cgroup.kill: Linux 5.14 and later
            (path / "cgroup.kill").write_text("1")
            return
    try:
        pids = (path / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(ValueError):
            _kill_member(int(pid), path)


def _kill_member(pid: int, path: Path) -> None:
    """SIGKILL `pid` if it is still in the cgroup at `path`. A pid read from cgroup.procs may have
    exited since, and been given to a process outside (the daemon's own, another user's command):
    a pidfd is taken first, which always means the same process, then its cgroup is checked, then
    the pidfd is signalled (ESRCH if the process it means is gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # ENOSYS: a kernel older than 5.3; the check below at least narrows the race
        fd = None
    try:
        if not _in_group(pid, path):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fd is None:
                os.kill(pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        if fd is not None:
            os.close(fd)


def _in_group(pid: int, path: Path) -> bool:
    """Whether /proc says `pid` is in a cgroup named like `path` (the names are unique: they carry
    the daemon's pid and a counter)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.rpartition(":")[2].rstrip("/").endswith("/" + path.name) for line in lines)

