"""`shell`: one command under /bin/sh in the sandbox, in the caller's workspace (/workspace), with
its role's network, limits and extra paths. Refuses when the sandbox cannot run (see
sandbox/runner.py), and when the workspace is full or the disk nearly so (sandbox/disk_budget.py)."""

from __future__ import annotations

import signal
from typing import Any

from sandbox.disk_budget import DiskFull
from skills.base import Skill, SkillContext, SkillDenied, SkillError, visible


class ShellSkill(Skill):
    name = "shell"
    description = ("Run a shell command (/bin/sh -c) in an isolated sandbox. The working directory is "
                   "/workspace, the user's own folder; other files are read-only or hidden, and the "
                   "network is off unless the user's role grants it. Returns exit status and output.")
    parameters = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "e.g. ls -la"}},
        "required": ["command"],
        "additionalProperties": False,
    }
    permissions = frozenset({"exec"})
    keeps_wall_clock = True  # the runner kills the command at wall_seconds, and when cancelled
    # Acts, and its output (files, the network) is untrusted: the defaults, said out loud.
    side_effects = True
    untrusted_output = True

    def describe(self, args: dict[str, Any]) -> str:
        return f"run the shell command: {visible(args.get('command', ''))}"

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        command = args["command"]
        if not command.strip():
            raise SkillError("the command is empty")
        try:
            result = await ctx.run(command)
        except DiskFull as exc:
            raise SkillDenied(f"the command was not run: {exc}") from None
        ctx.audit.exit_status = result.exit_status
        if result.timed_out:
            status = f"killed after {ctx.principal.limits.wall_seconds:g} s (wall-clock limit)"
            ctx.audit.detail, ctx.audit.failed = "killed at the wall-clock limit", True
            if result.disk_exceeded:
                status += f"; then {result.disk_exceeded}: delete files to make room"
                ctx.audit.detail += f"; over its disk budget: {result.disk_exceeded}"
        elif result.disk_exceeded and result.exit_status is None:
            status = f"killed: {result.disk_exceeded}; delete files to make room"
            ctx.audit.detail, ctx.audit.failed = f"killed: {result.disk_exceeded}", True
        else:
            status = (f"exit status {result.exit_status}" + _signal_note(result.exit_status, ctx)
                      + _allocation_note(result, ctx))
            if result.disk_exceeded:  # it ended before the watch could stop it
                status += f"; then {result.disk_exceeded}: delete files to make room"
                ctx.audit.detail, ctx.audit.failed = f"over its disk budget: {result.disk_exceeded}", True
        if result.memory_exceeded:  # the cgroup's kill: all of its processes together
            limit = ctx.principal.limits.memory_bytes >> 20
            status += (f"; out of memory: its processes together went over the {limit} MB they "
                       "may use (memory_mb; files in /tmp and /dev/shm count too), and the "
                       "kernel killed processes of it")
            ctx.audit.detail = "; ".join(filter(None, [ctx.audit.detail, f"out of memory ({limit} MB)"]))
            ctx.audit.failed = True
        parts = [status + ("" if result.isolation == "bubblewrap" else " (NOT sandboxed)")]
        # Said first: a folder missing from the command's view explains what it found, and the
        # user can put it back (`mv docs2 docs`).
        parts += [f"note: run without a granted folder: {why}" for why in result.left_out]
        if result.left_out:  # the audit log says so too: the admin's record of what ran, and how
            ctx.audit.detail = "; ".join(filter(None, [ctx.audit.detail, *(
                f"run without a granted folder: {why}" for why in result.left_out)]))
        if result.stdout:
            parts.append("stdout:\n" + result.stdout)
        if result.stderr:
            parts.append("stderr:\n" + result.stderr)
        return "\n".join(parts)  # a cut output already says where it was cut


# What programs print when an allocation fails (Python, C's strerror(ENOMEM), C++, Node, Java):
# under RLIMIT_AS the command is not killed, its allocation fails, and only its own words say so.
_ALLOCATION_FAILED = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory",
                      "Out of memory", "OutOfMemoryError")


def _allocation_note(result: Any, ctx: SkillContext) -> str:
    """For a command that failed saying an allocation failed: the role's limit, which is the likely
    cause, so the model does not retry it unchanged."""
    if not result.exit_status or not any(word in result.stderr for word in _ALLOCATION_FAILED):
        return ""
    return (f" (out of memory: each of its processes may use {ctx.principal.limits.memory_bytes >> 20} "
            "MB, the role's memory_mb)")


def _signal_note(status: int | None, ctx: SkillContext) -> str:
    """What an exit status the shell reports for a killed command (128 + signal) most likely
    means here, so the model does not retry what a limit stopped."""
    if status is None:
        return ""
    limits = ctx.principal.limits
    killed_by = -status if status < 0 else status - 128  # -N unwrapped, 128+N from a shell
    if killed_by == signal.SIGXCPU:
        return f" (stopped at the CPU-time limit of {limits.cpu_seconds} s)"
    if killed_by == signal.SIGKILL:
        return (f" (killed: usually a limit, the CPU time ({limits.cpu_seconds} s) or memory "
                f"({limits.memory_bytes >> 20} MB))")
    if killed_by == signal.SIGSEGV:
        return " (crashed: a segmentation fault, which a memory limit can cause)"
    return ""
