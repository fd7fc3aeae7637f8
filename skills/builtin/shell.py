"""`shell`: one command under /bin/sh in the sandbox, in the caller's workspace (/workspace), with
its role's network, limits and extra paths. Refuses when the sandbox cannot run (see runner.py)."""

from __future__ import annotations

from typing import Any

from skills.base import Skill, SkillContext, SkillError, visible


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

    def describe(self, args: dict[str, Any]) -> str:
        return f"run the shell command: {visible(args.get('command', ''))}"

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        command = args["command"]
        if not command.strip():
            raise SkillError("the command is empty")
        result = await ctx.run(command)
        ctx.audit.exit_status = result.exit_status
        if result.timed_out:
            status = f"killed after {ctx.principal.limits.wall_seconds:g} s (wall-clock limit)"
            ctx.audit.detail, ctx.audit.failed = "killed at the wall-clock limit", True
        else:
            status = f"exit status {result.exit_status}"
        parts = [status + ("" if result.isolation == "bubblewrap" else " (NOT sandboxed)")]
        if result.stdout:
            parts.append("stdout:\n" + result.stdout)
        if result.stderr:
            parts.append("stderr:\n" + result.stderr)
        if result.truncated:
            parts.append(f"[output cut at {ctx.principal.limits.output_bytes} bytes]")
        return "\n".join(parts)
