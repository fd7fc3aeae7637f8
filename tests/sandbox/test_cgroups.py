"""Commands' memory cgroups (sandbox.cgroups) on this machine's real cgroup hierarchy: a group
bounds the memory of every process in it together, says when the kernel killed for it, and is
gone after; one a dead daemon left is removed, one of a live daemon kept."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys

import pytest

from sandbox import cgroups
from sandbox.cgroups import PREFIX, Cgroups
from sandbox.runner import Limits, Scope, run_command

PLACE, WHY = Cgroups().available()
pytestmark = pytest.mark.skipif(PLACE is None, reason=f"no memory cgroups here: {WHY}")

MB = 1 << 20
# Four processes of 40 MB each: every one is under an RLIMIT_AS that lets it be, and together they
# are over 100 MB. Each touches every page, so it is charged. Exit status: how many were killed.
HOGS = """
import os, signal, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(40 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(WAIT)
        os._exit(0)
    children.append(pid)
statuses = [os.waitpid(pid, 0)[1] for pid in children]
os._exit(sum(os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGKILL for s in statuses))
"""

def run_in(group: cgroups.CommandGroup, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], timeout=timeout, capture_output=True,
                          preexec_fn=functools.partial(cgroups.join, group.procs_path))


def test_processes_together_over_the_limit_are_killed_and_that_is_reported():
    group = Cgroups().create(100 * MB)
    try:
        done = run_in(group, HOGS.replace("WAIT", "5"))
        assert done.returncode > 0  # killed by the kernel's OOM killer, inside the group
        assert group.out_of_memory()
    finally:
        group.remove()
    assert not group.path.exists()


def test_a_command_within_its_limit_runs_and_is_not_reported():
    group = Cgroups().create(300 * MB)
    try:
        done = run_in(group, HOGS.replace("WAIT", "0"))
        assert done.returncode == 0, done.stderr
        assert not group.out_of_memory()
    finally:
        group.remove()


def test_remove_kills_what_is_left_in_the_group():
    group = Cgroups().create(100 * MB)
    left = subprocess.Popen(["sleep", "60"],
                            preexec_fn=functools.partial(cgroups.join, group.procs_path))
    try:
        group.remove()
        assert left.wait(timeout=10) == -9
        assert not group.path.exists()
    finally:
        left.kill()


def test_a_dead_daemons_groups_are_removed_and_a_live_ones_kept():
    stale = PLACE.root / f"{PREFIX}{_a_dead_pid()}-0"
    kept = PLACE.root / f"{PREFIX}{os.getppid()}-0"  # a live process (this one's parent)
    stale.mkdir()
    kept.mkdir()
    try:
        Cgroups().available()
        assert not stale.exists()
        assert kept.exists()
    finally:
        for path in (stale, kept):
            if path.exists():
                path.rmdir()


def _a_dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


# Memory no rlimit charges: memfds written and kept open. One process, far under RLIMIT_AS.
MEMFDS = ("python3 -c \"import os; fds = [os.memfd_create('m') for _ in range(8)]; "
          "[os.write(f, b'x' * (40 << 20)) for f in fds]; print('all kept')\"")


async def test_memory_no_rlimit_charges_is_bounded_by_the_commands_cgroup(workspace):
    result = await run_command(MEMFDS, Scope(workspace), Limits(memory_bytes=200 * MB))
    assert result.memory_exceeded
    assert "all kept" not in result.stdout


async def test_a_command_within_its_memory_is_not_reported(workspace):
    result = await run_command(MEMFDS.replace("range(8)", "range(2)"), Scope(workspace),
                               Limits(memory_bytes=200 * MB))
    assert result.stdout == "all kept\n" and not result.memory_exceeded


async def test_no_cgroup_outlives_its_command_however_it_ends(workspace):
    ours = f"{PREFIX}{os.getpid()}-"

    def groups() -> list[str]:
        return [p.name for p in PLACE.root.iterdir() if p.name.startswith(ours)]

    before = groups()
    await run_command("sleep 60 & echo started", Scope(workspace), Limits())  # a child left behind
    await run_command("sleep 60", Scope(workspace), Limits(wall_seconds=0.5))  # killed at the limit
    task = asyncio.create_task(run_command("sleep 60", Scope(workspace), Limits()))
    await asyncio.sleep(0.5)
    task.cancel()  # /stop
    with pytest.raises(asyncio.CancelledError):
        await task
    assert groups() == before
