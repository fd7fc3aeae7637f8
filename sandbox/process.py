"""Supervision of one command's process: its rlimits, cgroup and OOM score (set in the child before
exec), its output read under one byte budget, the wait against the wall clock and the disk budget,
and the kill of its whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Awaitable
from pathlib import Path

from sandbox import cgroups
from sandbox.disk_budget import CommandWatch
from sandbox.scope import Limits, SandboxUnavailable
from sandbox.to_end import run_to_end

READ_CHUNK = 64 * 1024
# After the command exits (or is killed) its pipes should close at once; anything still holding them
# escaped the process group, and we stop waiting for it after this long.
DRAIN_GRACE_S = 2.0
EXIT_POLL_S = 0.01
# The OOM killer's preference for the command's processes over every other (1000: first).
OOM_SCORE_ADJ = b"1000"


def tasks_of_uid(uid: int) -> int:
    """Processes and threads the kernel counts against `uid`'s RLIMIT_NPROC right now. The kernel
    charges a task to its real uid; /proc/<pid>'s owner is the effective one, which differs for a
    setuid program the daemon's user started (real uid ours, not counted) and for a process that only
    took our uid as its effective one (counted, though the kernel does not)."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as status:
                for line in status:  # "Uid:" (real, effective, ...) comes before "Threads:"
                    if line.startswith(b"Uid:") and int(line.split()[1]) != uid:
                        break
                    if line.startswith(b"Threads:"):
                        count += int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            pass  # it exited while we looked
    return count


def set_rlimits(limits: Limits, nproc: int, cgroup_procs: bytes | None = None) -> None:
    """Runs in the child between fork and exec; the limits are inherited by bwrap and the command,
    and so is its cgroup (`cgroup_procs`: the command's; see sandbox.cgroups)."""
    def set_limit(kind: int, value: int) -> None:
        resource.setrlimit(kind, (value, value))

    if cgroup_procs is not None:
        cgroups.join(cgroup_procs)

    # Memory no rlimit charges (SysV shared memory, memfds, many processes) can still run the host
    # out: the OOM killer is then to pick the command, never the daemon and its model (the command
    # inherits the score). First, with bare system calls: under the limits below this child, which
    # still holds all of the daemon's descriptors, could open and allocate nothing. Best effort.
    with contextlib.suppress(OSError):
        score = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(score, OOM_SCORE_ADJ)
        finally:
            os.close(score)
    # SIGXCPU at the limit (the shell reports 152, which says "CPU time"), SIGKILL a second later
    # for a command that catches it.
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    set_limit(resource.RLIMIT_AS, limits.memory_bytes)
    set_limit(resource.RLIMIT_FSIZE, limits.file_size_bytes)
    set_limit(resource.RLIMIT_NPROC, nproc)
    set_limit(resource.RLIMIT_NOFILE, limits.open_files)
    set_limit(resource.RLIMIT_CORE, 0)


class Output:
    """The command's stdout and stderr, read by tasks of our own under one byte budget for both
    (what is over it is read and dropped). Never communicate(): output survives a timeout, and a
    background child that keeps a pipe open cannot make us wait forever (NOTES.md, Sandboxing)."""

    def __init__(self, proc: asyncio.subprocess.Process, limit: int) -> None:
        self.left = limit
        self.limit = limit
        self.truncated = False
        self.readers = [asyncio.create_task(self._drain(proc.stdout)),
                        asyncio.create_task(self._drain(proc.stderr))]

    async def _drain(self, stream: asyncio.StreamReader) -> str:
        kept = bytearray()
        cut = False
        while chunk := await stream.read(READ_CHUNK):
            take = min(len(chunk), self.left)
            kept += chunk[:take]
            self.left -= take
            if take < len(chunk):
                cut = self.truncated = True
        text = kept.decode("utf-8", errors="replace")
        if cut:
            text += f"\n[output cut at {self.limit} bytes]\n"
        return text

    def cancel(self) -> None:
        for task in self.readers:
            task.cancel()

    async def collected(self) -> tuple[str, str]:
        """(stdout, stderr) once the command is gone: a pipe still open DRAIN_GRACE_S later is
        held by something that escaped the group, and what it would still say is not waited for."""
        done, pending = await asyncio.wait(self.readers, timeout=DRAIN_GRACE_S)
        for task in pending:
            task.cancel()
        stdout, stderr = (task.result() if task in done else "" for task in self.readers)
        return stdout, stderr


def kill_group(pgid: int) -> None:
    """SIGKILL the process group we started (bwrap, or the unsandboxed shell), and the children of
    its leader: bwrap's child, the sandbox's pid 1, has a session of its own (--new-session), and
    bwrap arms --die-with-parent only a few milliseconds in, so a kill right after the start would
    miss it; killing the pid namespace's pid 1 ends all of it. The group is stopped first so that
    its leader cannot start another child while we look."""
    try:
        os.killpg(pgid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return  # the group is already gone
    try:
        children = Path(f"/proc/{pgid}/task/{pgid}/children").read_text().split()
    except OSError:  # the leader has exited, or a kernel without CONFIG_PROC_CHILDREN
        children = []
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(child), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _exited_within(proc: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the process exited in time. Not proc.wait(): on Python 3.11 that also waits for the pipes
    to close, so a background child holding stdout would keep it (and us) waiting to the wall limit."""
    deadline = time.monotonic() + seconds
    while proc.returncode is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(EXIT_POLL_S, left))
    return True


async def ended_within(proc: asyncio.subprocess.Process, seconds: float,
                       watch: CommandWatch) -> tuple[bool, str | None]:
    """(exited, why it was killed for its disk use): the wall-clock wait of _exited_within, cut
    short when the disk watch finds the command over its budget."""
    if not watch.active:
        return await _exited_within(proc, seconds), None
    waiting = asyncio.create_task(_exited_within(proc, seconds))
    watching = asyncio.create_task(watch.overrun())
    try:
        await asyncio.wait({waiting, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when we are cancelled (/stop): the caller kills the group
        waiting.cancel()
        watching.cancel()
    if waiting.done() and not waiting.cancelled() and waiting.result():
        return True, None
    if watching.done() and not watching.cancelled():
        return False, watching.result()
    return False, None  # the wall-clock limit


async def start(spawning: Awaitable[asyncio.subprocess.Process]) -> asyncio.subprocess.Process:
    """Start the process even when cancelled meanwhile (/stop, a tool timeout). A cancellation that
    lands inside create_subprocess_exec leaves the child running where nobody will kill it, and
    can hang the caller (python/cpython#103847), so the start runs to its end; a process started
    for a cancelled caller is killed, with its group, at once."""
    try:
        return await run_to_end(spawning, lambda proc: kill_group(proc.pid))
    except subprocess.SubprocessError as exc:  # from set_rlimits, in the child before exec
        raise SandboxUnavailable(f"cannot start the command: its memory cgroup or its limits "
                                 f"could not be set ({exc})") from None
