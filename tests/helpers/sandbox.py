"""Running commands under the real bubblewrap sandbox in tests: small limits, a runner that checks
each call ends within its wall limit, a link planted as a command could, an old bwrap."""

from __future__ import annotations

from pathlib import Path

from sandbox.runner import run_command
from sandbox.scope import Limits, Scope

# Small limits keep the suite fast; every call must still return within its wall limit.
LIMITS = Limits(cpu_seconds=2, memory_bytes=256 << 20, wall_seconds=4, output_bytes=4096,
                file_size_bytes=1 << 20, processes=32, open_files=64)


async def run(command, workspace, limits=LIMITS, **kwargs):
    scope = Scope(workspace, network=kwargs.pop("network", False))
    result = await run_command(command, scope, limits, **kwargs)
    assert result.duration_s < limits.wall_seconds + 2
    return result


async def swap_for_link(folder: Path, target: Path, scope: Scope, limits=LIMITS) -> None:
    """What a command may do in a writable share: move `folder` aside and put a link to `target`
    in its place, for the next command to be handed or bound (a command run with `scope`)."""
    planted = await run_command(f"cd {folder.parent} && mv {folder.name} old && "
                                f"ln -s {target} {folder.name} && echo ok", scope, limits)
    assert planted.stdout == "ok\n", planted.stderr


# A stand-in for bubblewrap before 0.7 (no --size), to be formatted with the real one's path.
OLD_BWRAP = """#!/bin/sh
# bubblewrap before 0.7: no --size. Everything else is the real one's.
if [ "$1" = --help ]; then
    env > "$0.help-env"
    {bwrap} --help 2>&1 | grep -v -e --size
    exit 0
fi
for arg; do
    if [ "$arg" = --size ]; then echo "bwrap: Unknown option --size" >&2; exit 1; fi
done
exec {bwrap} "$@"
"""
