"""Commands' memory cgroups (sandbox.cgroups) on this machine's real cgroup hierarchy: a group
bounds the memory of every process in it together, says when the kernel killed for it, and is
gone after; one a dead daemon left is removed, one of a live daemon kept."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sandbox import cgroups
from sandbox.cgroups import PREFIX, Cgroups
from sandbox.runner import run_command
from sandbox.scope import Limits, SandboxUnavailable, Scope

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


class _SlowToMake(Cgroups):
    """Makes the group, then takes its time (a busy host, the first command's search for stale
    groups): a cancellation lands while the thread that made it has not returned yet."""

    def create(self, memory_bytes: int) -> cgroups.CommandGroup | None:
        group = super().create(memory_bytes)
        time.sleep(0.3)
        return group


async def test_a_command_cancelled_while_its_cgroup_is_made_leaves_none_behind(monkeypatch):
    ours = f"{PREFIX}{os.getpid()}-"
    before = [p.name for p in PLACE.root.iterdir() if p.name.startswith(ours)]
    monkeypatch.setattr(cgroups, "default", _SlowToMake())

    async def command() -> None:
        async with cgroups.command_group(100 * MB):
            await asyncio.sleep(60)

    task = asyncio.create_task(command())
    await asyncio.sleep(0.1)  # inside create, in its thread
    task.cancel()  # /stop
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.5)  # the thread is done by now, whatever it made
    left = [p for p in PLACE.root.iterdir() if p.name.startswith(ours) and p.name not in before]
    for path in left:  # not to leave them to this test run's host
        path.rmdir()
    assert left == []


def test_a_pid_no_longer_in_the_group_is_not_killed(tmp_path: Path):
    # What remove() reads from cgroup.procs may be stale by the time it signals: the command's
    # process exited, and its pid went to a process outside the group. Here cgroup.procs is a
    # plain file naming a process that was never in the group.
    outside = subprocess.Popen(["sleep", "60"])
    try:
        gone = tmp_path / f"{PREFIX}{os.getpid()}-99"
        gone.mkdir()
        (gone / "cgroup.procs").write_text(f"{outside.pid}\n")
        cgroups._kill_all(gone, 1)
        time.sleep(0.2)
        assert outside.poll() is None
    finally:
        outside.kill()
        outside.wait()


def _fake_v2_cgroup(folder: Path) -> Path:
    """A folder shaped like a v2 cgroup offering the memory controller, with only us in it."""
    folder.mkdir()
    (folder / "cgroup.controllers").write_text("cpu memory pids\n")
    (folder / "cgroup.subtree_control").write_text("")
    (folder / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return folder


def test_a_v2_cgroup_systemd_has_not_delegated_is_not_used_though_writable(tmp_path: Path):
    # Root may write every cgroup, and a user every cgroup of its user manager: neither means the
    # cgroup was delegated. systemd rewrites the subtree_control of a unit without Delegate=, and
    # would take the memory controller (the limits) off the commands' cgroups below.
    cgroup = _fake_v2_cgroup(tmp_path / "openclaw.service")
    place, why = cgroups._v2_place(cgroup, settle=False)
    assert place is None and "not delegated" in why and "Delegate=memory" in why
    try:
        os.setxattr(cgroup, "user.delegate", b"1")  # what systemd sets on a Delegate= unit's
    except OSError as exc:
        pytest.skip(f"no user xattrs on {tmp_path}: {exc}")
    place, why = cgroups._v2_place(cgroup, settle=False)
    assert place == cgroups.Place(2, cgroup), why


def test_the_root_of_a_cgroup_namespace_is_ours_to_divide(tmp_path: Path):
    # A container's (or ProtectControlGroups=private's) own cgroup namespace: nothing marks it.
    cgroup = _fake_v2_cgroup(tmp_path / "ns-root")
    place, why = cgroups._v2_place(cgroup, settle=False, ns_root=True)
    assert place == cgroups.Place(2, cgroup), why


# As the unprivileged daemon of a system unit sees its cgroup: its own, the parent root's.
AS_USER = """
import sys
from pathlib import Path
from sandbox import cgroups
place, why = cgroups._v2_place(Path(sys.argv[1]), settle=False)
print(place is not None, why)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a folder to another uid")
@pytest.mark.parametrize("parent_owner, delegated", [(0, True), (65534, False)])
def test_an_unprivileged_daemon_takes_a_cgroup_handed_to_it_and_no_other(parent_owner, delegated,
                                                                         unprivileged_daemon):
    # Delegate= with User=: systemd gives the unit's cgroup (not its parent) to the user. Below a
    # user manager, the parent is the user's too, and writable says nothing of delegation.
    top = Path(tempfile.mkdtemp(prefix="openclaw-cg-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        parent = top / "system.slice"
        parent.mkdir(mode=0o755)
        os.chown(parent, parent_owner, parent_owner)
        cgroup = _fake_v2_cgroup(parent / "openclaw.service")
        for path in (cgroup, *cgroup.iterdir()):
            os.chown(path, 65534, 65534)
        done = subprocess.run([unprivileged_daemon.python, "-c", AS_USER, str(cgroup)],
                              capture_output=True, text=True, timeout=30, user=65534, group=65534,
                              cwd="/", env={"PYTHONPATH": str(unprivileged_daemon.path)})
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(str(delegated)), done.stdout
    finally:
        shutil.rmtree(top)


async def test_a_command_that_cannot_join_its_cgroup_is_refused_not_run_unbounded(workspace,
                                                                                monkeypatch):
    # A real group, gone before the command's first process can join it (as one removed by an
    # admin's cleanup would be): the start fails, and says why.
    def gone(memory_bytes: int) -> cgroups.CommandGroup:
        group = Cgroups().create(memory_bytes)
        group.path.rmdir()
        return group

    monkeypatch.setattr(cgroups.default, "create", gone)
    with pytest.raises(SandboxUnavailable, match="memory cgroup or its limits could not be set"):
        await run_command("touch ran", Scope(workspace), Limits())
    assert not (workspace / "ran").exists()
