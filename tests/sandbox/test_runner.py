"""The process runner against real bubblewrap: each hostile command is contained, and the Result says so."""

import asyncio
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from sandbox.process import tasks_of_uid
from sandbox.runner import run_command
from sandbox.scope import SANDBOX_UID, Limits, SandboxUnavailable, Scope
from tests.helpers.processes import processes_running
from tests.helpers.sandbox import LIMITS, OLD_BWRAP, run

pytestmark = pytest.mark.usefixtures("bwrap_installed")  # see conftest.py


async def test_echo_status_stderr_cwd_and_files_land_in_workspace(workspace):
    result = await run("echo hello; echo oops >&2; pwd; echo data > out.txt; "
                       "grep CapEff /proc/self/status; id -u; exit 3", workspace)
    assert result.isolation == "bubblewrap"
    assert result.exit_status == 3 and not result.timed_out and not result.truncated
    lines = result.stdout.splitlines()
    assert lines[:2] == ["hello", "/workspace"]
    assert lines[2].split() == ["CapEff:", "0000000000000000"]
    if os.geteuid() == 0:
        assert lines[3] == "65534"  # never root inside, so RLIMIT_NPROC applies
    else:
        assert lines[3] == str(os.getuid())  # our own uid in its user namespace, not root there
    assert result.stderr == "oops\n"
    assert (workspace / "out.txt").read_text() == "data\n"


async def test_etc_shadow_cannot_be_read(workspace):
    result = await run("cat /etc/shadow", workspace)
    assert result.exit_status != 0 and "root:" not in result.stdout
    assert "No such file" in result.stderr


async def test_host_root_home_and_ssh_are_not_visible(workspace):
    result = await run("ls -a /root || ls /root/.ssh || ls -a $HOME", workspace)
    assert result.exit_status == 0 and result.stdout.split() == [".", ".."]  # only the empty workspace
    assert "cannot access '/root'" in result.stderr
    assert ".ssh" not in result.stdout and ".bashrc" not in result.stdout


async def test_writing_outside_the_workspace_fails(workspace):
    name = f"openclaw-sbx-{os.getpid()}"
    attempts = " || ".join(f"touch {d}/{name}" for d in ("/usr", "/etc", "", "/proc"))
    result = await run(f"{attempts} || echo all-refused", workspace)
    assert result.stdout.strip() == "all-refused"
    assert "Read-only file system" in result.stderr
    assert not any(Path(d, name).exists() for d in ("/usr", "/etc", "/"))


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)  # the kernel completes the handshake without accept()
    yield server.getsockname()[1]
    server.close()


CONNECT = ("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); "
           "print('connected')\"")


async def test_without_network_the_host_is_out_of_reach(workspace, listener):
    # With network, the host's loopback is still out of reach: see test_network.py.
    denied = await run(CONNECT.format(port=listener), workspace)
    assert denied.exit_status != 0 and "connected" not in denied.stdout
    assert "ConnectionRefused" in denied.stderr or "unreachable" in denied.stderr


async def test_fork_bomb_is_contained_and_returns(workspace):
    started = time.monotonic()
    result = await run("f(){ f|f& };f; sleep 4321", workspace)
    assert time.monotonic() - started < LIMITS.wall_seconds + 2
    assert result.isolation == "bubblewrap"
    assert "Cannot fork" in result.stderr  # stopped by the process limit, not only by the wall clock
    assert processes_running("sleep", "4321") == []


# Forks sleepers until the process limit refuses one, says how many it got, and holds them a moment:
# unlike a fork bomb's, the count of tasks then stands still, so sampling /proc sees it exactly.
FORK_UNTIL_REFUSED = """
import os, time
forked = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        forked += 1
except OSError:
    pass
print(forked, flush=True)
time.sleep(1)
"""


async def test_a_daemon_with_many_threads_can_still_fork_and_a_fork_bomb_gets_only_its_limit(workspace):
    # An unprivileged daemon's commands share its uid, and RLIMIT_NPROC counts every task of that uid,
    # threads included: the command's `processes` must come on top of ours, and no more than that.
    uid = SANDBOX_UID if os.geteuid() == 0 else os.getuid()
    idle, sampling = threading.Event(), threading.Event()
    threads = [threading.Thread(target=idle.wait) for _ in range(100)]
    peak = 0

    def sample():
        nonlocal peak
        while sampling.is_set():
            peak = max(peak, tasks_of_uid(uid))
            time.sleep(0.005)

    for thread in threads:
        thread.start()
    try:
        assert len(threads) > LIMITS.processes
        result = await run("for i in $(seq 20); do sleep 0.2 & done; wait; echo forked", workspace)
        assert result.exit_status == 0 and result.stdout == "forked\n", result.stderr
        result = await run("f(){ f|f& };f; sleep 4325", workspace)
        assert "Cannot fork" in result.stderr
        assert processes_running("sleep", "4325") == []

        (workspace / "forks.py").write_text(FORK_UNTIL_REFUSED)
        # Start every thread of asyncio's executor now, so that our count stands still from here on:
        # otherwise run_command's to_thread may start one more just after we counted.
        await asyncio.gather(*(asyncio.to_thread(time.sleep, 0.05) for _ in range(64)))
        sampling.set()
        sampler = threading.Thread(target=sample)
        threads.append(sampler)
        sampler.start()
        before = await asyncio.to_thread(tasks_of_uid, uid)
        result = await run("python3 forks.py", workspace)
        sampling.clear()
        sampler.join()
        assert result.exit_status == 0, result.stderr
        # sh/python and bwrap's own processes (as an unprivileged daemon) are part of the limit too
        assert LIMITS.processes - 8 <= int(result.stdout) < LIMITS.processes, result.stdout
        assert before < peak <= before + LIMITS.processes, (before, peak)
        assert processes_running("python3", "forks.py") == []  # the held children went with it
    finally:
        idle.set()
        sampling.clear()
        for thread in threads:
            thread.join()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start processes with mixed uids")
def test_tasks_count_against_their_real_uid_as_the_kernel_counts_them():
    # A setuid program the daemon's user started (real uid ours) counts against our RLIMIT_NPROC; a
    # process that only took our uid as its effective one does not. /proc/<pid>'s owner is the latter.
    uid = 1_499_999_999  # nobody's
    before = tasks_of_uid(uid)
    started = [subprocess.Popen(["sleep", "4326"], preexec_fn=functools.partial(os.setresuid, *uids))
               for uids in ((uid, 0, 0), (uid, 0, 0), (0, uid, 0))]
    try:
        assert tasks_of_uid(uid) == before + 2
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


async def test_infinite_loop_is_killed_by_cpu_limit(workspace):
    result = await run("while :; do :; done", workspace)
    assert result.timed_out or result.exit_status in (128 + 9, 128 + 24)  # SIGKILL / SIGXCPU
    assert result.duration_s < LIMITS.wall_seconds + 1


async def test_sleeping_command_is_killed_at_wall_limit(workspace):
    limits = Limits(wall_seconds=2, processes=32)
    result = await run("echo before; sleep 4322", workspace, limits)
    assert result.timed_out and result.exit_status is None
    assert result.stdout == "before\n"  # output read before the kill is kept
    # Killed at the limit, not before it, and promptly: not after the drain's grace as well
    # (DRAIN_GRACE_S, 2 s), as when a sleep that outlived the kill held the pipes open.
    assert 2 <= result.duration_s < 3.5
    assert processes_running("sleep", "4322") == []


async def test_memory_hog_fails(workspace):
    result = await run("python3 -c 'x = bytearray(4 << 30)'", workspace)
    assert result.exit_status != 0 and "MemoryError" in result.stderr


async def test_flood_of_output_is_cut_with_marker_and_returns_quickly(workspace):
    # 100 MB, 25,000 times the budget: read and thrown away as it comes, or `head` would block on
    # the full pipe until the wall limit. (A gigabyte took 3 s of the 4 on a loaded machine.)
    result = await run("yes | head -c 100000000; echo done >&2", workspace)
    assert result.truncated and result.exit_status == 0
    assert result.stdout.endswith("\n[output cut at 4096 bytes]\n")
    assert len(result.stdout) < 4096 + 64
    assert result.duration_s < LIMITS.wall_seconds


async def test_background_process_does_not_survive_or_hang_the_call(workspace):
    result = await run("sleep 4323 & echo started", workspace)
    assert result.exit_status == 0 and result.stdout == "started\n" and not result.timed_out
    # Nowhere near the wall limit, where a call that waited for the end of the pipes the sleep
    # holds open would end.
    assert result.duration_s < LIMITS.wall_seconds - 1
    assert processes_running("sleep", "4323") == []


async def test_daemon_environment_is_not_visible(workspace, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = await run("env", workspace, env={"GREETING": "hi"})
    assert "hunter2" not in result.stdout and "SECRET_TOKEN" not in result.stdout
    assert set(result.stdout.split()) == {"PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
                                          "HOME=/workspace", "LANG=C.UTF-8", "GREETING=hi", "PWD=/workspace"}


async def test_missing_bwrap_refuses_with_the_fix(workspace):
    with pytest.raises(SandboxUnavailable) as refused:
        await run("echo hi", workspace, bwrap_path="/nonexistent/bwrap")
    assert "apt-get install bubblewrap" in str(refused.value)
    assert "allow_unsandboxed = true" in str(refused.value)


async def test_allow_unsandboxed_runs_without_isolation_but_with_limits(workspace, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    # A wall limit far above the CPU one: with half a core (a loaded machine) 2 s of CPU could
    # take over 4 s, and the wall limit came first.
    limits = replace(LIMITS, cpu_seconds=1, wall_seconds=30)
    result = await run("echo hi > f; pwd; env; sleep 4324 & while :; do :; done", workspace, limits,
                       bwrap_path="/nonexistent/bwrap", allow_unsandboxed=True)
    assert result.isolation == "none"
    assert result.stdout.splitlines()[0] == str(workspace)
    assert "hunter2" not in result.stdout
    assert result.exit_status == -signal.SIGXCPU and not result.timed_out  # the CPU limit applies
    assert result.duration_s < 20  # the background sleep does not hold the call to the wall limit
    assert (workspace / "f").read_text() == "hi\n"
    assert processes_running("sleep", "4324") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the workspace to another uid")
async def test_as_root_a_workspace_under_a_private_folder_works_and_the_command_is_unprivileged(tmp_path):
    # pytest's tmp_path is under a 0700 folder the sandbox uid could not walk through by itself.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = await run_command("id -u; grep CapBnd /proc/self/status; echo x > f", Scope(workspace), LIMITS)
    assert result.exit_status == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["65534", "CapBnd:\t0000000000000000"]
    assert (workspace / "f").stat().st_uid == 65534


async def test_granted_paths_are_bound_at_the_same_place_and_tmp_is_private(workspace):
    shared, inbox = (Path(tempfile.mkdtemp(prefix="openclaw-sbx-", dir="/tmp")) for _ in range(2))
    try:
        shared.chmod(0o755)
        inbox.chmod(0o777)
        (shared / "notes.txt").write_text("read me\n")
        scope = Scope(workspace, read_only=(shared,), read_write=(inbox,))
        command = (f"cat {shared}/notes.txt; touch {shared}/x || echo ro-refused; "
                   f"echo in > {inbox}/new.txt; echo t > /tmp/{workspace.name}.t && ls /tmp")
        result = await run_command(command, scope, LIMITS)
        # /tmp is a fresh tmpfs: our file plus the mount points of the two grants, nothing of the host's
        assert result.stdout.split() == ["read", "me", "ro-refused",
                                         *sorted([shared.name, inbox.name, f"{workspace.name}.t"])]
        assert not Path(f"/tmp/{workspace.name}.t").exists()
        assert not (shared / "x").exists() and (inbox / "new.txt").read_text() == "in\n"
    finally:
        shutil.rmtree(shared)
        shutil.rmtree(inbox)


async def test_a_read_only_folder_inside_a_writable_one_stays_read_only(tmp_path):
    # tmp_path is under a 0700 folder: as root, the folders above the binds must still be walkable.
    share, workspace = tmp_path / "share", tmp_path / "ws"
    (share / "ro").mkdir(parents=True)
    (workspace / "reference").mkdir(parents=True)
    (share / "ro/keep.txt").write_text("keep\n")
    (workspace / "reference/policy.txt").write_text("keep")
    # Everything writable by anyone: only the read-only mounts may stop the writes.
    for path in (share, share / "ro", workspace / "reference", share / "ro/keep.txt",
                 workspace / "reference/policy.txt"):
        path.chmod(0o777)
    scope = Scope(workspace, read_write=(share,), read_only=(share / "ro", workspace / "reference"))
    command = (f"echo new > {share}/new.txt && echo rw-ok; cat {share}/ro/keep.txt; "
               f"echo x > {share}/ro/keep.txt || echo ro-refused; "
               "echo x > /workspace/reference/policy.txt || echo ws-ro-refused; echo y > own.txt")
    result = await run_command(command, scope, LIMITS)
    assert result.stdout.split() == ["rw-ok", "keep", "ro-refused", "ws-ro-refused"], result.stderr
    assert (share / "ro/keep.txt").read_text() == "keep\n"
    assert (workspace / "reference/policy.txt").read_text() == "keep"
    assert (share / "new.txt").exists() and (workspace / "own.txt").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="per-user uids exist only when the daemon is root")
async def test_one_users_processes_do_not_use_up_anothers_process_limit(tmp_path):
    from sandbox.policy import sandbox_uid

    limits = Limits(wall_seconds=6, processes=8)
    busy, idle = tmp_path / "alice", tmp_path / "bob"
    busy.mkdir()
    idle.mkdir()
    alice, bob = sandbox_uid("telegram:1"), sandbox_uid("telegram:2")
    assert alice != bob
    hog = asyncio.create_task(run_command("for i in 1 2 3 4 5 6 7; do sleep 3 & done; wait",
                                          Scope(busy, uid=alice), limits))
    await asyncio.sleep(0.5)
    result = await run_command("id -u; sh -c 'echo forked'", Scope(idle, uid=bob), limits)
    assert result.stdout.split() == [str(bob), "forked"], result.stderr
    await hog


@pytest.mark.skipif(os.geteuid() == 0, reason="bwrap makes no user namespace as root")
async def test_an_unprivileged_sandbox_cannot_make_a_user_namespace_of_its_own(workspace):
    result = await run("unshare -Ur id -u; echo rc=$?", workspace)
    assert "rc=1" in result.stdout and "0\n" not in result.stdout


async def test_granted_paths_are_compared_as_the_kernel_sees_them(tmp_path):
    # The writable share is granted through a symlink and with "..": the read-only folder inside
    # it, given by its real path, must still be read-only.
    share, workspace = tmp_path / "data/share", tmp_path / "ws"
    (share / "ro").mkdir(parents=True)
    (workspace / "ref").mkdir(parents=True)
    (tmp_path / "link").symlink_to(share)
    (tmp_path / "wslink").symlink_to(workspace)
    for path, text in ((share / "ro/keep.txt", "keep\n"), (workspace / "ref/p.txt", "keep\n")):
        path.write_text(text)
    for path in (share, share / "ro", share / "ro/keep.txt", workspace / "ref", workspace / "ref/p.txt"):
        path.chmod(0o777)
    scope = Scope(tmp_path / "wslink", read_write=(tmp_path / "link",),
                  read_only=(share / "ro", workspace / ".." / "ws/ref"))
    command = (f"echo x > {share}/ro/keep.txt || echo ro-refused; "
               "echo x > /workspace/ref/p.txt || echo ws-ro-refused; echo y > own.txt")
    result = await run_command(command, scope, LIMITS)
    assert result.stdout.split() == ["ro-refused", "ws-ro-refused"], result.stderr
    assert (share / "ro/keep.txt").read_text() == "keep\n"
    assert (workspace / "ref/p.txt").read_text() == "keep\n"
    assert (workspace / "own.txt").exists()


async def test_a_command_cancelled_while_it_starts_leaves_nothing_running(workspace):
    # /stop or a tool timeout can land inside create_subprocess_exec; the process it was starting
    # must still be killed (python/cpython#103847), at every moment of the start, and the call
    # must return promptly.
    for i, delay in enumerate(0.001 * n for n in range(30)):  # the start takes a few ms
        marker = str(4400 + i)
        task = asyncio.create_task(run(f"sleep {marker}", workspace))
        await asyncio.sleep(delay)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, f"the cancelled run did not return (cancelled after {delay} s)"
        deadline = time.monotonic() + 2  # SIGKILL of the group, then the kernel tears it down
        while processes_running("sleep", marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert processes_running("sleep", marker) == [], f"left running after a cancel at {delay} s"


async def test_posix_shared_memory_works_for_the_sandbox_uid(workspace):
    # multiprocessing's locks and queues live in /dev/shm, which must be writable by the sandbox uid.
    program = ("import multiprocessing as mp\n"
               "if __name__ == '__main__':\n"
               "    with mp.Pool(2) as pool:\n"
               "        print(sum(pool.map(abs, [-1, -2, 3])))\n")
    (workspace / "pool.py").write_text(program)
    result = await run("python3 pool.py; stat -c %a /dev/shm", workspace)
    assert result.exit_status == 0, result.stderr
    assert result.stdout.split() == ["6", "1777"]


async def test_on_a_cpu_without_a_seccomp_filter_bubblewrap_still_isolates(workspace, monkeypatch):
    from sandbox import bwrap, seccomp

    monkeypatch.delitem(seccomp.ARCHES, os.uname().machine)
    bwrap.isolation_available.cache_clear()
    try:
        ok, why = bwrap.isolation_available()
        assert ok and "WITHOUT a seccomp filter" in why and os.uname().machine in why
        result = await run("grep Seccomp: /proc/self/status; cat /etc/shadow", workspace)
        assert result.isolation == "bubblewrap"
        assert result.stdout.split() == ["Seccomp:", "0"]  # no filter, but still in the sandbox
        assert result.exit_status != 0  # /etc/shadow is not there
    finally:
        bwrap.isolation_available.cache_clear()


# /tmp and /dev/shm are tmpfs: their files are RAM that RLIMIT_AS does not count. A small memory
# limit and a file-size limit above it, so the tmpfs, not RLIMIT_FSIZE, is what stops a write.
# /tmp is emptied before /dev/shm is filled: where the command has a memory cgroup, its files
# count there with everything else, and both full would pass memory_mb (sandbox.cgroups).
TMPFS_LIMITS = Limits(cpu_seconds=4, memory_bytes=128 << 20, wall_seconds=10, output_bytes=4096,
                      file_size_bytes=256 << 20, processes=32, open_files=64)
TMP_SIZE, SHM_SIZE = 96 << 20, 32 << 20  # together the memory limit, /dev/shm a quarter of it
MIB = 1 << 20
FILL_TMPFS = f"""
df -B1 --output=size /tmp /dev/shm | tail -n 2
head -c {TMP_SIZE - MIB} /dev/zero > /tmp/fits && echo tmp-fits
head -c {2 * MIB} /dev/zero > /tmp/over || echo tmp-full
rm /tmp/fits
head -c {SHM_SIZE - MIB} /dev/zero > /dev/shm/fits && echo shm-fits
head -c {2 * MIB} /dev/zero > /dev/shm/over || echo shm-full
"""


async def test_tmp_and_dev_shm_together_hold_no_more_than_the_memory_limit(workspace):
    result = await run(FILL_TMPFS, workspace, TMPFS_LIMITS)
    assert result.stdout.split() == [str(TMP_SIZE), str(SHM_SIZE), "tmp-fits", "tmp-full",
                                     "shm-fits", "shm-full"], result.stderr
    assert result.stderr.count("No space left on device") == 2, result.stderr  # ENOSPC


async def test_dev_is_read_only_but_its_devices_and_shm_work(workspace):
    result = await run("touch /dev/x; echo ok > /dev/null && echo null-ok; "
                       "python3 -c 'import os, pty; os.close(pty.openpty()[0]); print(\"pty-ok\")'; "
                       "echo s > /dev/shm/s && echo shm-ok", workspace)
    assert "Read-only file system" in result.stderr
    # An unprivileged daemon's commands get no ptys (tests/sandbox/test_ptys.py).
    pty = ["pty-ok"] if os.geteuid() == 0 else []
    assert result.stdout.split() == ["null-ok", *pty, "shm-ok"], result.stderr


async def test_the_oom_killer_picks_the_command_before_the_daemon(workspace):
    # What no rlimit bounds (SysV shared memory, memfds, many processes) may still exhaust the
    # host's memory: then the command's processes go first, never the daemon holding the model.
    result = await run("cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'",
                       workspace)
    assert result.stdout.split() == ["1000", "1000"], result.stderr
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # ours is unchanged


async def test_a_daemon_holding_many_descriptors_still_runs_commands(workspace):
    # Between fork and exec the child holds all of the daemon's descriptors (sockets, the GPU's
    # device files, other commands' pipes): nothing it does there may need one more under the
    # role's open-files limit.
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(LIMITS.open_files + 8)]
    try:
        assert held[-1] >= LIMITS.open_files
        result = await run("cat /proc/self/oom_score_adj", workspace)
    finally:
        for fd in held:
            os.close(fd)
    assert (result.exit_status, result.stdout.strip()) == (0, "1000"), result.stderr


# An unprivileged daemon (the usual system service, User=openclaw): bwrap makes a user namespace, and
# the command then owns the tmpfs bwrap mounts for /dev. Run as `nobody` when the tests are root.
# It imports only the sandbox package, from the copy `daemon.path` holds (see conftest.py).
UNPRIVILEGED_DAEMON = """
import asyncio, json, sys
from pathlib import Path
from sandbox.runner import run_command
from sandbox.scope import Limits, Scope

limits = Limits(**json.loads(sys.argv[2]))
result = asyncio.run(run_command(sys.argv[1], Scope(Path({workspace!r})), limits))
print(json.dumps([result.exit_status, result.stdout, result.stderr, result.isolation]))
"""


def run_as_unprivileged_daemon(command: str, workspace: Path, daemon) -> tuple[int, str, str, str]:
    prefix = []
    if daemon.uid is not None:
        os.chown(workspace, daemon.uid, daemon.uid)
        prefix = ["setpriv", f"--reuid={daemon.uid}", f"--regid={daemon.uid}", "--clear-groups", "--"]
    script = UNPRIVILEGED_DAEMON.format(workspace=str(workspace))
    done = subprocess.run([*prefix, daemon.python, "-c", script, command, json.dumps(asdict(TMPFS_LIMITS))],
                          capture_output=True, text=True, timeout=30, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(daemon.path)})
    assert done.returncode == 0, done.stderr
    return tuple(json.loads(done.stdout))


def test_an_unprivileged_daemons_commands_get_the_same_bounded_tmpfs_and_a_read_only_dev(
        workspace, unprivileged_daemon):
    status, stdout, stderr, isolation = run_as_unprivileged_daemon(
        f"id -u; stat -c %u /dev; touch /dev/x || echo dev-refused; {FILL_TMPFS}", workspace,
        unprivileged_daemon)
    assert isolation == "bubblewrap"
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    # The command owns /dev (bwrap made it, in the command's user namespace), but cannot write there.
    assert stdout.split() == [str(uid), str(uid), "dev-refused", str(TMP_SIZE), str(SHM_SIZE),
                              "tmp-fits", "tmp-full", "shm-fits", "shm-full"], stderr
    assert "Read-only file system" in stderr


async def test_an_old_bubblewrap_without_size_still_runs_and_says_tmp_is_unlimited(
        workspace, tmp_path, monkeypatch, caplog):
    from sandbox import bwrap

    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    old = tmp_path / "bwrap-0.6"
    old.write_text(OLD_BWRAP.format(bwrap=shutil.which("bwrap")))
    old.chmod(0o755)
    ok, why = bwrap.isolation_available(str(old))  # what `openclaw doctor` shows
    assert ok and "WITHOUT a size limit on /tmp and /dev/shm" in why and "upgrade bubblewrap" in why
    assert "WITHOUT a size limit" in caplog.text and str(old) in caplog.text  # the daemon's log
    result = await run("df -B1 --output=size /tmp | tail -n 1", workspace, bwrap_path=str(old))
    assert result.exit_status == 0 and int(result.stdout) > TMP_SIZE, result.stderr
    # Asking bwrap what it can do does not hand it the daemon's environment either.
    assert "hunter2" not in (tmp_path / "bwrap-0.6.help-env").read_text()
    # The real bubblewrap here has --size: no such warning for it.
    ok, why = bwrap.isolation_available()
    assert ok and "WITHOUT a size limit" not in why
