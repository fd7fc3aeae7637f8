"""What a user's commands may put on disk, against real bubblewrap and the real filesystem: the
workspace's measure, the quota and the free-space reserve checked before a command starts, and a
command that writes past either killed while it runs, but never for what others wrote."""

import asyncio
import errno
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox import disk, disk_budget
from sandbox.disk_budget import DiskFull
from sandbox.runner import run_command
from sandbox.scope import Limits, Scope
from tests.helpers.waiting import eventually

MB = 1 << 20
QUOTA = 8 * MB
# Generous time: a command killed for its disk use must be killed long before any of this.
LIMITS = Limits(cpu_seconds=30, memory_bytes=256 << 20, wall_seconds=60, output_bytes=4096,
                file_size_bytes=4 * MB, processes=32, open_files=64, disk_bytes=QUOTA)
# Keeps writing 1 MB files (random bytes: a compressing filesystem must not shrink them), a
# little at a time, far past the quota if nobody stops it.
WRITER = ("i=0; while [ $i -lt {n} ]; do head -c {size} /dev/urandom > f$i || exit 9; "
          "i=$((i+1)); sleep 0.05; done; echo finished")


def blocks(path: Path) -> int:
    """What one inode counts for: its allocated blocks, at least INODE_CHARGE (an empty file or a
    short symlink takes no block, but an inode)."""
    return max(os.lstat(path).st_blocks * disk.BLOCK, disk.INODE_CHARGE)


async def until(condition, timeout: float = 30.0) -> None:
    async def check():
        return condition()
    await eventually(check, bool, timeout)


def fill(path: Path, size: int) -> Path:
    with open(path, "wb") as file:
        file.write(os.urandom(size))
        file.flush()
        os.fsync(file.fileno())
    return path


# -- the measure ----------------------------------------------------------------------------------


def test_usage_counts_allocated_blocks_each_hard_link_once_and_follows_no_symlink(tmp_path):
    folder = tmp_path / "ws"
    (folder / "sub").mkdir(parents=True)
    fill(folder / "sub" / "data", MB)
    os.link(folder / "sub" / "data", folder / "again")  # the same megabyte, twice in the tree
    os.symlink("/usr", folder / "usr")  # gigabytes, if it were followed
    with open(folder / "sparse", "wb") as sparse:  # 100 MB long, almost nothing stored
        sparse.truncate(100 * MB)
    expected = sum(blocks(p) for p in (folder, folder / "sub", folder / "sub" / "data",
                                       folder / "usr", folder / "sparse"))
    assert disk.usage(folder) == expected
    assert MB <= expected < 2 * MB


async def test_a_tree_nested_past_path_max_is_measured_and_its_commands_still_run(workspace):
    # A command makes 30 folders of 200-character names: paths of 6,000 bytes, past PATH_MAX.
    name = "d" * 200
    (workspace / "deep.py").write_text(
        f"import os\nfor _ in range(30):\n    os.mkdir({name!r})\n    os.chdir({name!r})\n"
        "open('data', 'wb').write(os.urandom(1 << 20))\nprint('made')\n")
    made = await run_command("python3 deep.py", Scope(workspace), LIMITS)
    assert made.stdout == "made\n", made
    assert disk.usage(workspace) >= 31 * disk.INODE_CHARGE + MB
    # The measure before each command copes: the user can still remove the tree.
    result = await run_command(f"rm -rf {name} && echo gone", Scope(workspace), LIMITS)
    assert result.stdout == "gone\n" and result.exit_status == 0, result
    assert disk.usage(workspace) < MB


@pytest.mark.parametrize("mode", [0o000, 0o400, 0o600, 0o100])
def test_a_folder_its_owner_locked_is_still_counted_and_made_readable(workspace, mode):
    # An unprivileged daemon runs commands as its own uid, so a command can lock a folder against
    # the daemon's measure (not listable, or listable but not enterable), the workspace itself
    # included: measure as a plain uid owning the tree (nobody, when the tests are root).
    owner = 65534 if os.geteuid() == 0 else os.geteuid()
    hidden = workspace / "hidden"
    (hidden / "deeper").mkdir(parents=True)
    fill(hidden / "deeper" / "data", 2 * MB)
    for path in (workspace, hidden, hidden / "deeper", hidden / "deeper" / "data"):
        os.chown(path, owner, owner)
    hidden.chmod(mode)
    workspace.chmod(mode)
    pid = os.fork()
    if pid == 0:  # a fork, not a new interpreter: the venv's may sit under a folder nobody can enter
        try:
            os.setgid(owner)
            os.setuid(owner)
            os._exit(0 if disk.usage(workspace) >= 2 * MB else 1)
        except BaseException:
            os._exit(2)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    for folder in (workspace, hidden):
        assert folder.stat().st_mode & 0o500 == 0o500, oct(folder.stat().st_mode)  # for its owner


def make_chain(top: Path, depth: int, payload: int, siblings: bool = False) -> None:
    """`depth` nested folders named "d" under `top`, `payload` bytes at the bottom; with
    `siblings`, beside each "d" a folder "s" holding a 4 KiB file."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            if siblings:
                os.mkdir("s", dir_fd=fd)
                with open(os.open("s/f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as file:
                    file.write(b"x" * 4096)
            fd = descend(fd, "d")
        with open(os.open("data", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as file:
            file.write(os.urandom(payload))
    finally:
        os.close(fd)


def descend(fd: int, name: str) -> int:
    """Make the folder `name` in the folder `fd` and return its descriptor; `fd` is closed."""
    try:
        os.mkdir(name, dir_fd=fd)
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    finally:
        os.close(fd)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_tree_deeper_than_the_descriptors_held_is_measured_to_the_bottom(tmp_path):
    make_chain(tmp_path, 1100, 4 * MB)  # past 1,024 open folders, the usual soft limit
    before = open_descriptors()
    peak = []

    def counting_charge(st, charge=disk.charge):
        peak.append(open_descriptors())
        return charge(st)

    # Every entry is charged once; the descriptors open meanwhile are counted at each.
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(disk, "charge", counting_charge)
            total = disk.usage(tmp_path)
    finally:  # rm walks by descriptors; pytest's clean-up (shutil.rmtree) would recurse too deep
        subprocess.run(["rm", "-rf", "--", str(tmp_path / "d")], check=True)
    assert total >= 4 * MB + 1100 * disk.INODE_CHARGE
    assert max(peak) <= before + disk.MAX_HELD + 2  # the walk's own, and scandir's duplicate
    assert open_descriptors() == before


def in_child_with_descriptors(limit_above_open: int, work) -> int:
    """Run `work()` (an int, or an exception's class name) in a fork whose RLIMIT_NOFILE leaves it
    `limit_above_open` descriptors beyond those open now; returns what it gave back."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            import resource
            limit = open_descriptors() + limit_above_open
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
            try:
                answer = str(work())
            except Exception as exc:
                answer = type(exc).__name__
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer


def test_climbing_back_up_a_deep_tree_holds_few_descriptors_and_misses_nothing(tmp_path):
    # A sibling beside every folder of a 1,100-deep chain: going back up, the walk re-opens the
    # folders it closed, and must not hold them all at once (the daemon's limit is often 1,024).
    make_chain(tmp_path, 1100, MB, siblings=True)
    try:
        expected = 1100 * 2 * disk.INODE_CHARGE + 1100 * 4096 + MB
        measured = in_child_with_descriptors(disk.MAX_HELD + 16, lambda: disk.usage(tmp_path))
        assert int(measured) >= expected, measured
        # Too few descriptors for even MAX_HELD: the measure refuses, it never counts less.
        starved = in_child_with_descriptors(8, lambda: disk.usage(tmp_path))
        assert starved == "Unmeasurable", starved
    finally:  # rm walks by descriptors; pytest's clean-up (shutil.rmtree) would recurse too deep
        subprocess.run(["rm", "-rf", "--", str(tmp_path / "d"), str(tmp_path / "s")], check=True)


def test_climbing_back_up_costs_a_few_opens_a_folder_whatever_the_shape(tmp_path, monkeypatch):
    # A 150-deep spine with a 62-deep side chain at every level: each side chain pushes the
    # spine's descriptors out, and climbing back up re-opens them through "..", one open a level
    # (re-opened by name from the top, it took about depth²/2 opens: minutes for a large quota).
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(150):
            side = descend(os.dup(fd), "s")
            for _ in range(disk.MAX_HELD - 3):
                side = descend(side, "c")
            os.close(side)
            fd = descend(fd, "d")
    finally:
        os.close(fd)
    folders = 150 * (1 + disk.MAX_HELD - 2)
    opens = []
    real_open = os.open
    monkeypatch.setattr(disk.os, "open", lambda *a, **k: opens.append(1) or real_open(*a, **k))
    try:
        total = disk.usage(tmp_path)
    finally:
        monkeypatch.undo()
        subprocess.run(["rm", "-rf", "--", str(tmp_path / "d"), str(tmp_path / "s")], check=True)
    assert total >= (folders + 1) * disk.INODE_CHARGE
    assert len(opens) < 3 * folders, len(opens)  # two a folder (O_PATH, then "."), and the ".."s


@pytest.mark.parametrize("race", ["renames", "out of descriptors"])
def test_a_walk_raced_while_it_climbs_back_up_leaks_no_descriptor(tmp_path, monkeypatch, race):
    # Climbing back up, the walk re-opens closed parents through ".." (by name if that fails).
    # Raced there, by a command renaming the folder being left and an ancestor (the by-name
    # re-open then stops short), or by the daemon running out of descriptors, it must close all
    # it opened: a daemon leaking one per walk soon cannot open its store.
    make_chain(tmp_path, 30, 0, siblings=True)
    aside = Path(tempfile.mkdtemp(dir=tmp_path.parent))
    monkeypatch.setattr(disk, "MAX_HELD", 8)
    real, raced = disk._open_listable, []

    def racing(parent, name):
        where = Path(os.readlink(f"/proc/self/fd/{parent}")) if parent is not None else None
        if name == ".." and not raced and len(where.relative_to(tmp_path).parts) >= 20:
            raced.append(where)
            if race == "out of descriptors":
                raise OSError(errno.EMFILE, "Too many open files")
            where.rename(aside / "left")
            tmp_path.joinpath(*where.relative_to(tmp_path).parts[:10]).rename(aside / "ancestor")
        return real(parent, name)

    monkeypatch.setattr(disk, "_open_listable", racing)
    before = open_descriptors()
    try:
        if race == "out of descriptors":
            with pytest.raises(disk.Unmeasurable):
                disk.usage(tmp_path)
        else:
            assert disk.usage(tmp_path) > 0  # what moved away is not counted: measured as found
        assert raced and open_descriptors() == before
    finally:
        subprocess.run(["rm", "-rf", "--", str(tmp_path / "d"), str(tmp_path / "s"), str(aside)],
                       check=True)


def test_a_tree_nested_past_the_depth_limit_is_refused_not_let_through(workspace, monkeypatch):
    monkeypatch.setattr(disk, "MAX_DEPTH", 50)
    make_chain(workspace, 60, MB)
    with pytest.raises(disk.Unmeasurable):
        disk.usage(workspace)
    with pytest.raises(DiskFull) as refused:
        asyncio.run(run_command("echo never", Scope(workspace), LIMITS))
    assert str(refused.value).startswith("the workspace cannot be measured: its folders are nested "
                                         "more than 50 deep")
    shutil.rmtree(workspace / "d" / "d" / "d")  # the same tree, less deep, is measured
    assert disk.usage(workspace) >= 3 * disk.INODE_CHARGE


MEASURE_WITH_A_MOUNT_INSIDE = """
import os, subprocess, sys
from sandbox import disk
folder = sys.argv[1]
before = disk.usage(folder)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", folder + "/mnt"], check=True)
with open(folder + "/mnt/elsewhere", "wb") as file:
    file.write(os.urandom(4 << 20))
# A single file bound over one in the folder: the admin's, not the user's to pay for.
open(folder + "/model.bin", "wb").close()
subprocess.run(["mount", "--bind", folder + "/mnt/elsewhere", folder + "/model.bin"], check=True)
print(before, disk.usage(folder))
"""


def test_usage_does_not_count_another_filesystem_mounted_inside(tmp_path):
    folder = tmp_path / "ws"
    (folder / "mnt").mkdir(parents=True)
    # In a mount namespace of its own (a user namespace too when we are not root): the tmpfs is
    # gone with the child, whatever happens.
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--mount"]
    done = subprocess.run([*unshare, sys.executable, "-c", MEASURE_WITH_A_MOUNT_INSIDE, str(folder)],
                          capture_output=True, text=True, timeout=30, cwd=Path(__file__).parents[2])
    if "unshare failed" in done.stderr or "Operation not permitted" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    # The mount point's own (tmpfs) blocks at most, not the 4 MB file there or bound in again.
    assert after < before + MB


# -- before a command starts ----------------------------------------------------------------------


async def test_a_command_in_a_workspace_over_its_quota_is_refused_and_does_not_run(workspace):
    fill(workspace / "big", 2 * MB)
    with pytest.raises(DiskFull) as refused:
        await run_command("touch ran", Scope(workspace), replace(LIMITS, disk_bytes=MB))
    assert str(refused.value).startswith("the workspace is full: 2.0 MB used of its 1 MB quota")
    assert "delete files to make room" in str(refused.value)
    assert not (workspace / "ran").exists()
    # No quota (the built-in admin's 0): the same workspace runs commands.
    result = await run_command("touch ran", Scope(workspace), replace(LIMITS, disk_bytes=0))
    assert result.exit_status == 0 and (workspace / "ran").exists()


async def test_a_command_is_refused_when_the_disk_is_under_the_reserve(workspace):
    reserve = disk.free_bytes(workspace) + 100 * MB  # more than is free: the check must refuse
    with pytest.raises(DiskFull) as refused:
        await run_command("touch ran", Scope(workspace), LIMITS, min_free_bytes=reserve)
    assert str(refused.value).startswith("the disk holding your workspace is nearly full")
    assert "min_free_disk_mb" in str(refused.value)
    assert not (workspace / "ran").exists()


async def test_the_reserve_also_guards_the_daemons_data_folder(workspace):
    # The data folder on a filesystem the command cannot even write: its free space still counts.
    with tempfile.TemporaryDirectory(dir="/dev/shm") as data:
        data = Path(data)
        if disk.device(data) == disk.device(workspace):
            pytest.skip("/dev/shm is not a filesystem of its own here")
        reserve = disk.free_bytes(data) + 100 * MB
        if disk.free_bytes(workspace) < reserve:
            pytest.skip("the workspace's filesystem has less room than /dev/shm here")
        with pytest.raises(DiskFull) as refused:
            await run_command("touch ran", Scope(workspace), LIMITS, min_free_bytes=reserve,
                              protected=(data,))
    assert str(refused.value).startswith("the disk holding the daemon's data is nearly full")
    assert not (workspace / "ran").exists()


# -- while it runs --------------------------------------------------------------------------------


async def test_a_command_that_keeps_writing_past_its_quota_is_killed_not_far_over_it(workspace):
    result = await run_command(WRITER.format(n=64, size=MB), Scope(workspace), LIMITS)
    assert result.disk_exceeded and result.disk_exceeded.startswith(
        "the workspace went over its 8 MB disk quota"), result
    assert result.exit_status is None and not result.timed_out
    assert "finished" not in result.stdout
    used = disk.usage(workspace)
    assert QUOTA < used < QUOTA + 24 * MB, used  # it would have written 64 MB


async def test_empty_files_count_against_the_quota_and_a_command_making_them_is_killed(workspace):
    # Inodes, not blocks: each empty file takes one of the filesystem's fixed number of inodes.
    if os.statvfs(workspace).f_files == 0:
        pytest.skip("this filesystem counts no inodes")
    for i in range(3):
        (workspace / f"empty{i}").touch()
    assert disk.usage(workspace) >= 4 * disk.INODE_CHARGE  # the folder and its three files
    maker = ("i=0; while [ $i -lt 50000 ]; do : > e$i || exit 9; i=$((i+1)); "
             "[ $((i % 250)) -eq 0 ] && sleep 0.05; done; echo finished")
    result = await run_command(maker, Scope(workspace), LIMITS)
    assert result.disk_exceeded and result.disk_exceeded.startswith(
        "the workspace went over its 8 MB disk quota"), result
    assert "finished" not in result.stdout
    made = len(os.listdir(workspace))
    assert QUOTA // disk.INODE_CHARGE < made < 25000, made  # 2048 fit in 8 MB; it would make 50000


async def test_a_command_quicker_than_the_watch_is_reported_and_the_next_one_refused(workspace,
                                                                                      monkeypatch):
    monkeypatch.setattr(disk_budget, "POLL_S", 600)  # the watch never looks while it runs
    result = await run_command("for i in 1 2 3; do head -c 4194304 /dev/zero > b$i; done; echo done",
                               Scope(workspace), LIMITS)  # 12 MB against 8
    assert result.exit_status == 0 and result.stdout == "done\n", result
    assert result.disk_exceeded and result.disk_exceeded.startswith(
        "the workspace went over its 8 MB disk quota"), result
    with pytest.raises(DiskFull):
        await run_command("echo never", Scope(workspace), LIMITS)


def test_what_hid_from_the_walks_while_a_command_ran_is_found_after_it(workspace, tmp_path):
    # A walk while the command runs races it: a folder renamed away at the right moment is missed,
    # and that walk resets the watch's estimate. The measure after the command starts again from
    # the room the command began with.
    watch = disk_budget.CommandWatch(workspace, (), (), quota=QUOTA, reserve=0)
    assert watch.check() is None
    hidden = workspace / "hidden"
    hidden.mkdir()
    for i in range(12):
        fill(hidden / f"f{i}", MB)
    aside = Path(tempfile.mkdtemp(dir=workspace.parent))
    try:
        hidden.rename(aside / "hidden")  # where the walk does not look, as it walks
        assert watch.check() is None  # 12 MB lost, 0 found: "others wrote it", estimate reset
        (aside / "hidden").rename(hidden)
        assert watch.check() is None  # no room lost since that reset: no walk
        assert watch.after().startswith("the workspace went over its 8 MB disk quota")
    finally:
        shutil.rmtree(aside)


async def test_fallocate_is_refused_and_posix_fallocate_writes_the_blocks_itself(workspace):
    # fallocate(2) would reserve gigabytes between two of the watch's looks.
    result = await run_command(
        "fallocate -l 4M reserved; echo rc=$?; python3 -c 'import os; "
        "fd = os.open(\"written\", os.O_CREAT | os.O_WRONLY); os.posix_fallocate(fd, 0, 3 << 20)'",
        Scope(workspace), LIMITS)
    assert result.stdout.startswith("rc=1") and "not supported" in result.stderr, result
    assert result.exit_status == 0, result
    assert os.lstat(workspace / "written").st_blocks * disk.BLOCK >= 3 * MB  # glibc wrote them


async def test_a_command_is_killed_when_the_disk_falls_under_the_reserve(workspace):
    # A reserve a little under what is free now: the command's own writes take the disk below it.
    reserve = disk.free_bytes(workspace) - 96 * MB
    limits = replace(LIMITS, disk_bytes=0)  # no quota: the reserve alone stops it
    result = await run_command(WRITER.format(n=64, size=4 * MB), Scope(workspace), limits,
                               min_free_bytes=reserve)
    assert result.disk_exceeded and result.disk_exceeded.startswith(
        "free space on the disk holding your workspace fell to"), result
    assert "kept free for everyone" in result.disk_exceeded
    assert result.exit_status is None and "finished" not in result.stdout


async def test_writes_outside_the_workspace_on_the_same_disk_do_not_get_a_command_killed(workspace, caplog):
    caplog.set_level(logging.DEBUG, logger="sandbox.disk_budget")
    elsewhere = Path(tempfile.mkdtemp(prefix="openclaw-other-", dir=workspace.parent))
    assert disk.device(elsewhere) == disk.device(workspace)
    try:
        running = asyncio.create_task(run_command(
            "touch started; while [ ! -e go ]; do sleep 0.05; done; echo survived",
            Scope(workspace), LIMITS))
        await until((workspace / "started").exists)
        # Another user's 32 MB: the free space drops by four times what this one may still write.
        await asyncio.to_thread(fill, elsewhere / "theirs", 32 * MB)
        # The watch sees the drop, measures the workspace exactly, and finds it far under its quota.
        await until(lambda: "not over" in caplog.text)
        (workspace / "go").touch()
        result = await running
    finally:
        running.cancel()  # a failed wait above: the command and its sandbox are killed
        shutil.rmtree(elsewhere)
    assert result.exit_status == 0 and result.disk_exceeded is None, result
    assert result.stdout == "survived\n"
