"""Running one shell command isolated: the entry point (`run_command`, and `Sandbox`, the runner as
the daemon configured it) that ties together bubblewrap's command line (sandbox.bwrap), the
granted folders opened safely (sandbox.grants), the disk budget (sandbox.disk_budget), the memory
cgroup (sandbox.cgroups), the network (sandbox.network) and the process's supervision
(sandbox.process).

Where bubblewrap cannot run, or cannot load the seccomp filter, commands are refused with
SandboxUnavailable unless the admin set `[sandbox] allow_unsandboxed = true`: the rlimits still
apply then, and as root the uid drop, but an unprivileged daemon runs the command as its own user,
able to read the daemon's config and data. The sandbox never shares the host's network namespace:
a role granted network gets user-mode networking in its own, and without slirp4netns such a role's
commands are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox import cgroups, network, process, seccomp
from sandbox.bwrap import (
    FIX_HINT,
    SANDBOX_PATH,
    bound_fds,
    bwrap_argv,
    bwrap_binds_fds,
    bwrap_sizes_tmpfs,
    command_prefix,
    filter_fds,
    isolation_available,
)
from sandbox.disk_budget import CommandWatch
from sandbox.grants import Grants, UnsafeGrant, hand_over
from sandbox.scope import WORKSPACE_MOUNT, Limits, Result, SandboxUnavailable, Scope
from sandbox.to_end import run_to_end

log = logging.getLogger(__name__)


async def sandbox_ready(scope: Scope, bwrap_path: str | None, allow_unsandboxed: bool,
                        slirp4netns_path: str | None, what: str) -> tuple[bool, bool]:
    """(isolated, with network) for running `what` ("commands", "programs") in `scope`'s sandbox;
    SandboxUnavailable, saying how to fix it, when it cannot run as configured."""
    ok, why = await asyncio.to_thread(isolation_available, bwrap_path)
    if not ok and not allow_unsandboxed:
        raise SandboxUnavailable(f"cannot run sandboxed {what}: {why}. {FIX_HINT}")
    linked = ok and scope.network
    if linked and (lacking := network.missing(slirp4netns_path)):
        raise SandboxUnavailable(f"cannot run {what} with network: {lacking}. {network.INSTALL_HINT}")
    return ok, linked


async def run_command(command: str, scope: Scope, limits: Limits, *, bwrap_path: str | None = None,
                      allow_unsandboxed: bool = False, env: dict[str, str] | None = None,
                      slirp4netns_path: str | None = None, min_free_bytes: int = 0,
                      protected: tuple[Path, ...] = ()) -> Result:
    """Run `/bin/sh -c command` in the sandbox and return its (possibly cut) output and status.
    `min_free_bytes`: free space to keep on every filesystem it can write and on those of
    `protected` (the daemon's data folder); refused with DiskFull when the workspace is at its
    quota (limits.disk_bytes) or one of them is under that already."""
    ok, linked = await sandbox_ready(scope, bwrap_path, allow_unsandboxed, slirp4netns_path, "commands")
    # Opened once, and kept open while it runs: handed over, measured and bound as they are now
    # (sandbox.grants), whatever a command running meanwhile renames. Closed if we are cancelled
    # while the thread opens them.
    with await run_to_end(asyncio.to_thread(open_grants, scope), Grants.close) as grants:
        await asyncio.to_thread(hand_over, grants.workspace.fd, scope.uid)
        # The read_write folders it will have, where they really are: not the configured paths,
        # which a link put where a left-out folder was would lead to another filesystem's free
        # space. Then the one walk of the workspace a command costs (none without a quota);
        # raises DiskFull.
        writable = tuple(g.path for g in grants.others if g.writable and g.fd is not None)
        watch = await asyncio.to_thread(CommandWatch, scope.workspace, writable, protected,
                                        quota=limits.disk_bytes, reserve=min_free_bytes)
        home = WORKSPACE_MOUNT if ok else str(scope.workspace)
        clean_env = {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", **(env or {})}

        # RLIMIT_NPROC counts every task of the uid. As root the command gets a uid of its own; as an
        # unprivileged daemon it shares ours, whose threads (the engine's, asyncio's) must not count. A
        # snapshot: tasks of ours that start while the command runs (Python 3.11's waitpid thread for
        # this very process, say) come out of its budget, and ones that end add to it.
        nproc = limits.processes + (0 if os.geteuid() == 0
                                    else await asyncio.to_thread(process.tasks_of_uid, os.getuid())
                                    # slirp4netns, started after this count, runs as our uid too
                                    + (1 if linked else 0))
        # The command's memory, all of its processes together (sandbox.cgroups); removed after it.
        async with cgroups.command_group(limits.memory_bytes) as group:
            spawn = functools.partial(
                asyncio.create_subprocess_exec, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env,
                start_new_session=True,
                preexec_fn=functools.partial(process.set_rlimits, limits, nproc, group and group.procs_path))
            started = time.monotonic()
            # One deadline for all of the run: a network's setup takes its time out of wall_seconds.
            deadline = started + limits.wall_seconds
            # The link (and the slirp4netns it starts) is closed after the sandbox is killed, however the
            # run ends: normally, at the wall limit, on an error or a cancellation.
            async with (network.Link(network.locate(slirp4netns_path)) if linked
                        else contextlib.nullcontext()) as link:
                if ok:
                    proc = await _start_bwrap(bwrap_path, command, scope, limits, clean_env, spawn,
                                              link, grants)
                    left_out = grants.refused
                else:
                    proc = await process.start(spawn(*command_prefix(scope.uid), "/bin/sh", "-c", command,
                                                     cwd=scope.workspace))
                    left_out = []
                output = process.Output(proc, limits.output_bytes)
                try:
                    # connect() is False when bwrap failed in its setup: its stderr is then the answer.
                    if link is not None:
                        await link.connect(lambda: proc.returncode is None, deadline - time.monotonic())
                    exited, disk_exceeded = await process.ended_within(
                        proc, deadline - time.monotonic(), watch)
                    timed_out = not exited and disk_exceeded is None
                    killed = not exited
                except network.NetworkUnavailable as exc:
                    output.cancel()
                    raise SandboxUnavailable(f"cannot run commands with network: {exc}. {exc.hint}") from None
                finally:
                    # Also on normal exit: whatever the command left running in its group
                    # (`sleep 1000 &`) goes too.
                    process.kill_group(proc.pid)
            memory_exceeded = group is not None and group.out_of_memory()
            if disk_exceeded is None and watch.active:
                # Once more, with nothing of the command left to race the measure: one quicker than the
                # watch's first look, or one that hid from its walks, is reported (the next is refused).
                disk_exceeded = await asyncio.to_thread(watch.after)
            if disk_exceeded:
                log.warning("a command in %s went over its disk budget%s: %s", scope.workspace,
                            " (killed)" if killed else "", disk_exceeded)
            stdout, stderr = await output.collected()
            return Result(exit_status=None if killed else proc.returncode, stdout=stdout,
                          stderr=stderr, timed_out=timed_out, truncated=output.truncated,
                          duration_s=time.monotonic() - started,
                          isolation="bubblewrap" if ok else "none", disk_exceeded=disk_exceeded,
                          memory_exceeded=memory_exceeded, left_out=tuple(left_out))


async def _start_bwrap(bwrap_path: str | None, command: str, scope: Scope, limits: Limits,
                       env: dict[str, str], spawn: Callable[..., Awaitable[asyncio.subprocess.Process]],
                       link: network.Link | None, grants: Grants) -> asyncio.subprocess.Process:
    bwrap = bwrap_path or shutil.which("bwrap") or "bwrap"
    for why in grants.refused:
        log.warning("a command of %s runs without a granted folder: %s", scope.workspace, why)
    # bwrap has its own copies of the filter and the folders once started.
    with seccomp.program_fd() as filter_fd:
        argv = bwrap_argv(bwrap, command, scope, env, filter_fd, link, limits, grants)
        fds = filter_fds(filter_fd) + (link.pass_fds if link else ()) + bound_fds(argv)
        proc = await process.start(spawn(*argv, pass_fds=fds,
                                         stdin=link.stdin if link else subprocess.DEVNULL))
    if link is not None:
        link.spawned()
    return proc


def open_grants(scope: Scope) -> Grants:
    """The scope's folders, open for bwrap to bind (sandbox.grants), or why the command cannot run."""
    try:
        return Grants.of(scope)
    except UnsafeGrant as exc:
        raise SandboxUnavailable(f"refused to run the command: {exc}") from None
    except (FileNotFoundError, NotADirectoryError) as exc:
        if exc.filename != str(scope.workspace):
            raise SandboxUnavailable(f"cannot open the granted folder {exc.filename}: "
                                     f"{exc.strerror}; create it, or take it out of the role") from None
        raise ValueError(f"{exc.filename} is not a directory; create it first") from None
    except OSError as exc:
        raise SandboxUnavailable(f"cannot open the granted folder {exc.filename}: {exc.strerror}; "
                                 "create it, or take it out of the role") from None


@dataclass(frozen=True)
class Sandbox:
    """The runner as the daemon configured it ([sandbox] in the config): what skills are handed."""

    bwrap_path: str | None = None
    allow_unsandboxed: bool = False
    slirp4netns_path: str | None = None  # None: slirp4netns on PATH
    # Free space every command leaves on what it can write and on data_dir's filesystem, where the
    # store is ([sandbox] min_free_disk_mb; its default here too). 0: none.
    min_free_disk_bytes: int = 1 << 30
    data_dir: Path | None = None

    async def run(self, command: str, scope: Scope, limits: Limits,
                  env: dict[str, str] | None = None) -> Result:
        return await run_command(command, scope, limits, bwrap_path=self.bwrap_path,
                                 allow_unsandboxed=self.allow_unsandboxed, env=env,
                                 slirp4netns_path=self.slirp4netns_path,
                                 min_free_bytes=self.min_free_disk_bytes,
                                 protected=() if self.data_dir is None else (self.data_dir,))

    async def network(self) -> tuple[bool, str]:
        """(works, what): whether commands of roles granted network can run, for `doctor`: one
        real sandboxed command that must find its interface and default route."""
        isolated, why = await asyncio.to_thread(isolation_available, self.bwrap_path)
        if not isolated:
            return False, f"needs bubblewrap first: {why}"
        with tempfile.TemporaryDirectory(prefix="openclaw-netcheck-") as folder:
            try:
                # Not under the disk budget: a full disk is doctor's disk line, not the network's.
                result = await run_command(
                    "cat /proc/net/route", Scope(Path(folder), network=True),
                    Limits(wall_seconds=10, disk_bytes=0), bwrap_path=self.bwrap_path,
                    allow_unsandboxed=self.allow_unsandboxed, slirp4netns_path=self.slirp4netns_path)
            except SandboxUnavailable as exc:
                return False, str(exc)
        routes = [line.split()[:2] for line in result.stdout.splitlines()[1:]]
        if result.exit_status == 0 and [network.TAP, "00000000"] in routes:
            return True, (f"own namespace, user-mode NAT via {network.locate(self.slirp4netns_path)}; "
                          "the host's loopback and abstract sockets out of reach")
        return False, (f"a test command found no default route via {network.TAP} (exit status "
                       f"{result.exit_status}): {(result.stderr or result.stdout).strip()[-300:]}")

    def isolation(self) -> tuple[bool, str, bool]:
        """(usable, what, whole): whether commands can run, under which isolation, and whether it
        has every layer this runner adds (a seccomp filter, sized /tmp and /dev/shm, folders bound
        by descriptor), for `doctor`:
        usable but not whole is working, with a gap the admin should close."""
        ok, why = isolation_available(self.bwrap_path)
        if ok:
            bwrap = self.bwrap_path or shutil.which("bwrap") or "bwrap"
            return True, why, seccomp.supported() and bwrap_sizes_tmpfs(bwrap) and \
                bwrap_binds_fds(bwrap)
        if self.allow_unsandboxed:
            return True, f"NONE: commands run unsandboxed (allow_unsandboxed = true; {why})", False
        return False, f"unavailable: {why}", False
