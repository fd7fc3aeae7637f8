"""A long-running program in the sandbox, talking over its stdin and stdout (an MCP server): the
same bubblewrap command line, seccomp filter, granted folders, rlimits and memory cgroup as a shell
command (sandbox.runner), but no wall-clock limit and pipes both ways. Its stderr goes to a file
the caller reads when it must say why the program ended.

The CPU-time rlimit counts over the program's whole life: one that uses up the role's cpu_seconds
is stopped by the kernel like a command, and its owner restarts it. A program granted network
gets it as a command does (sandbox.network), and starts once it is up: the start-up gate is the
first line of its own stdin here, written before anything else is."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from typing import IO

from sandbox import cgroups, network, process, seccomp
from sandbox.bwrap import (
    SANDBOX_PATH,
    bound_fds,
    bwrap_argv,
    command_prefix,
    filter_fds,
)
from sandbox.grants import hand_over
from sandbox.runner import open_grants, sandbox_ready
from sandbox.scope import WORKSPACE_MOUNT, Limits, SandboxUnavailable, Scope
from sandbox.to_end import run_to_end

STDERR_KEPT = 4096  # of a service's stderr, for the message saying why it ended


class Service:
    """A started program: `proc` with stdin and stdout pipes. `close()` kills its whole process
    group and removes its cgroup; call it however the program ended."""

    def __init__(self, proc: asyncio.subprocess.Process, stack: contextlib.AsyncExitStack,
                 stderr: IO[bytes], isolation: str) -> None:
        self.proc, self._stack, self._stderr, self.isolation = proc, stack, stderr, isolation

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def stderr_tail(self) -> str:
        """The last STDERR_KEPT bytes it wrote to stderr."""
        with contextlib.suppress(OSError, ValueError):
            size = os.fstat(self._stderr.fileno()).st_size
            self._stderr.seek(max(0, size - STDERR_KEPT))
            return self._stderr.read().decode("utf-8", errors="replace").strip()
        return ""

    async def close(self) -> None:
        process.kill_group(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            await asyncio.shield(self.proc.wait())
        try:
            await self._stack.aclose()
        finally:
            self._stderr.close()


async def start_service(argv: list[str], scope: Scope, limits: Limits, *,
                        bwrap_path: str | None = None, allow_unsandboxed: bool = False,
                        env: dict[str, str] | None = None,
                        slirp4netns_path: str | None = None) -> Service:
    """Start `argv` in the sandbox of `scope` with `limits` (wall_seconds unused), its working
    directory /workspace; SandboxUnavailable when it cannot run as configured."""
    ok, linked = await sandbox_ready(scope, bwrap_path, allow_unsandboxed, slirp4netns_path, "programs")
    stack = contextlib.AsyncExitStack()
    stderr = tempfile.TemporaryFile()
    proc = None
    try:
        grants = stack.enter_context(await run_to_end(asyncio.to_thread(open_grants, scope),
                                                      lambda g: g.close()))
        await asyncio.to_thread(hand_over, grants.workspace.fd, scope.uid)
        home = WORKSPACE_MOUNT if ok else str(scope.workspace)
        clean_env = {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", **(env or {})}
        # As root each program has a uid of its own (the user's, or the shared server's): see
        # sandbox.runner for why an unprivileged daemon's count needs its own tasks added.
        nproc = limits.processes + (0 if os.geteuid() == 0
                                    else await asyncio.to_thread(process.tasks_of_uid, os.getuid()))
        group = await stack.enter_async_context(cgroups.command_group(limits.memory_bytes))
        spawn = functools.partial(
            asyncio.create_subprocess_exec, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, env=clean_env, start_new_session=True, limit=1 << 24,
            preexec_fn=functools.partial(process.set_rlimits, limits, nproc,
                                         group and group.procs_path))
        command = "exec " + shlex.join(argv)
        link = await stack.enter_async_context(network.Link(
            network.locate(slirp4netns_path), own_stdin=True)) if linked else None
        if ok:
            bwrap = bwrap_path or shutil.which("bwrap") or "bwrap"
            with seccomp.program_fd() as filter_fd:
                full = bwrap_argv(bwrap, command, scope, clean_env, filter_fd, link, limits, grants)
                fds = filter_fds(filter_fd) + (link.pass_fds if link else ()) + bound_fds(full)
                proc = await process.start(spawn(*full, pass_fds=fds))
        else:
            proc = await process.start(spawn(*command_prefix(scope.uid), "/bin/sh", "-c", command,
                                             cwd=scope.workspace))
        if link is not None:
            link.spawned()
            # False: bwrap failed in its setup, and its stderr says why when the caller reads it.
            if await link.connect(lambda: proc.returncode is None, network.SETUP_TIMEOUT_S):
                proc.stdin.write(b"go\n")  # the gate: before any message of the caller's
                await proc.stdin.drain()
    except BaseException as exc:
        if proc is not None:
            process.kill_group(proc.pid)
        stderr.close()
        await stack.aclose()
        if isinstance(exc, network.NetworkUnavailable):
            raise SandboxUnavailable(f"cannot run programs with network: {exc}. {exc.hint}") from None
        raise
    return Service(proc, stack, stderr, "bubblewrap" if ok else "none")
