"""What one sandboxed shell command costs the daemon beyond the command itself.

`run_command("true")` through the whole runner (isolation check, workspace and grants opened,
disk measure, bubblewrap with its seccomp filter, rlimits, the wall-clock and disk watch, and the
command's memory cgroup made and removed), against two peers in the same run: the same runner
with memory cgroups off (what the cgroup adds) and a bare `sh -c true` (the floor: a fork and exec).
Interleaved, so that a slow spell of the machine falls on all three alike.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sandbox import cgroups
from sandbox.runner import run_command
from sandbox.scope import Limits, Scope


async def _sandboxed(scope: Scope, with_cgroup: bool) -> float:
    found = cgroups.default.available()
    if not with_cgroup:
        cgroups.default._found = (None, "off for this measure")
    try:
        started = time.perf_counter()
        result = await run_command("true", scope, Limits())
        elapsed = time.perf_counter() - started
    finally:
        cgroups.default._found = found
    assert result.exit_status == 0, result.stderr
    return elapsed


async def _bare() -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", "true")
    await proc.wait()
    return time.perf_counter() - started


async def main(runs: int) -> None:
    workspace = Path(tempfile.mkdtemp(prefix="openclaw-bench-", dir="/tmp"))
    workspace.chmod(0o755)
    scope = Scope(workspace)
    place, why = cgroups.default.available()
    try:
        await _sandboxed(scope, True)  # warm: isolation check, seccomp program, bwrap's --help
        times: dict[str, list[float]] = {"cgroup": [], "no cgroup": [], "bare": []}
        for _ in range(runs):
            times["cgroup"].append(await _sandboxed(scope, True))
            times["no cgroup"].append(await _sandboxed(scope, False))
            times["bare"].append(await _bare())
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    p50 = {name: statistics.median(values) * 1000 for name, values in times.items()}
    print(f"memory cgroups: {why if place else 'NONE here: ' + why}")
    header = 'run_command("true")'
    print(f"{header:<40} {'p50 ms':>8} {'ratio':>7}")
    for name, label in (("cgroup", "sandboxed, with its memory cgroup"),
                        ("no cgroup", "peer: sandboxed, no cgroup"),
                        ("bare", "peer: bare sh -c true")):
        print(f"{label:<40} {p50[name]:>8.2f} {p50[name] / p50['no cgroup']:>7.2f}")
    print(f"the cgroup adds {p50['cgroup'] - p50['no cgroup']:.2f} ms a command "
          f"({runs} runs of each, interleaved)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    asyncio.run(main(parser.parse_args().runs))
