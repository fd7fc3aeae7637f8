"""`disk_usage`: the largest files and folders under a folder of the caller's workspace, measured
by `du` in the sandbox. The example Python skill of docs/skills.md."""

from __future__ import annotations

import shlex
from typing import Any

from skills import Skill, SkillContext, SkillDenied, SkillError

MAX_TOP = 50


class DiskUsageSkill(Skill):
    # What the model sees: the tool's name, what it is for, and the JSON schema of its arguments.
    # The executor checks a call's arguments against the schema before run() is called.
    name = "disk_usage"
    description = ("Show the largest files and folders under a folder of the user's workspace, "
                   "sizes in KiB, largest first.")
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string",
                     "description": "a folder of the workspace, e.g. projects (default: all of it)"},
            "top": {"type": "integer", "description": f"how many entries to show, 1 to {MAX_TOP}"},
        },
        "additionalProperties": False,
    }
    permissions = frozenset({"exec"})  # it runs a program in the sandbox (shown by `skills list`)

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        """[skills.disk_usage] takes `top`, the default number of entries; each problem names
        its key, and the daemon refuses to start with any."""
        problems = []
        for key, value in settings.items():
            if key != "top":
                problems.append(f"{key}: unknown setting (disk_usage takes: top)")
            elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOP:
                problems.append(f"top: must be a whole number from 1 to {MAX_TOP}, got {value!r}")
        return problems

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        top = args.get("top", ctx.settings.get("top", 10))
        if not 1 <= top <= MAX_TOP:
            # An expected failure: the model reads this as the tool's result and can try again.
            raise SkillError(f"top must be from 1 to {MAX_TOP}, got {top}")
        path = args.get("path", ".")
        if path.startswith("/") or ".." in path.split("/"):
            # Refused for this call: audited as "denied", with the reason.
            raise SkillDenied(f"{path!r} is not a folder of the workspace: give a relative path")
        # In the sandbox, as the caller: their workspace is /workspace (the working directory),
        # with their role's limits. Quote what the model wrote: it is one argument, never shell.
        result = await ctx.run(f"du -ak -- {shlex.quote(path)}")
        ctx.audit.exit_status = result.exit_status  # into the audit row of this call
        if result.timed_out:
            raise SkillError("du did not finish in time: ask for a smaller folder")
        if result.exit_status != 0 and not result.stdout:
            raise SkillError(f"du failed: {result.stderr.strip()[:300]}")
        entries = []
        for line in result.stdout.splitlines():
            size, _, name = line.partition("\t")
            if size.isdigit():
                entries.append((int(size), name))
        entries.sort(key=lambda entry: (-entry[0], entry[1]))
        lines = [f"{size:>10,} KiB  {name}" for size, name in entries[:top]]
        if result.truncated:
            lines.append("(du's output was cut at the role's output limit: this is part of the folder)")
        return "\n".join(lines) or f"{path} is empty"
