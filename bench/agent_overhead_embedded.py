"""The daemon's time outside the model per turn, with the embedded engine answering
(bench/agent_overhead.py's turns, on SmolLM2-135M-Instruct in this process, as `make run` serves).

A turn's time to the reply is the model's part (inside its streams: prefill, decode, and what the
agent does with each streamed piece between them) plus the daemon's own, which this prints: the
overhead the scripted model's bench measures alone, here with an engine thread beside the loop,
its hops, and prompts it really encodes. The peer is the model's part of the same turns: the
ratio says what share of the user's wait the daemon adds. Replies are cut at `--max-tokens` (the
model's time is not what is measured); the model decides whether to call the clock, so the share
of turns with a call is printed. `--profile` prints where the daemon's part goes
(bench/overhead_profile.py).

    .venv/bin/python bench/agent_overhead_embedded.py [--turns 60] [--history 10]
        [--max-tokens 8] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.agent_overhead import measure_overhead, percentile, with_loop_count  # noqa: E402
from bench.overhead_profile import Profile  # noqa: E402
from openclaw.backends.local import LocalBackend  # noqa: E402


class TimedBackend(LocalBackend):
    """The embedded engine as the daemon runs it, keeping the time spent inside its streams
    (from each call to its last output): the model's part of a turn."""

    inside = 0.0

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        start = time.perf_counter()
        try:
            async for out in super().generate(*args, **kwargs):
                yield out
        finally:
            self.inside += time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60, help="measured turns per history size")
    parser.add_argument("--history", default="10", help="stored messages before the turns")
    parser.add_argument("--max-tokens", type=int, default=8, help="a reply's token cap")
    parser.add_argument("--profile", action="store_true", help="where the daemon's part goes")
    args = parser.parse_args()

    from engine import AsyncLLM

    def make_model() -> TimedBackend:  # in the running loop: the engine's thread answers there
        return TimedBackend(AsyncLLM(kv_cache_gib=0.25))

    agent = f"reply_max_tokens = {args.max_tokens}\n"
    rows, tables = [], []
    for size in [int(n) for n in args.history.split(",")]:
        profile = Profile() if args.profile else None
        if profile is not None:
            profile.install(TimedBackend)
        to_reply, _whole, model = asyncio.run(with_loop_count(measure_overhead(
            args.turns, size, make_model, profile=profile, agent_config=agent), profile))
        rows.append((size, to_reply, model))
        if profile is not None:
            tables.append((size, profile.table()))
    load = os.getloadavg()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}; store: SQLite (WAL, a file); model: the embedded engine, replies of "
          f"at most {args.max_tokens} tokens\n")
    print("| stored messages | to reply p50 | model's part p50 | daemon's part p50 | p99 | "
          "daemon's / model's part, p50 | turns with a tool call |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size, to_reply, model in rows:
        own = [t - m for t, m in zip(to_reply, model, strict=True)]
        # The model's part of a turn with a call holds two model calls.
        called = sum(m > 1.5 * percentile(model, 0.1) for m in model) / len(model)
        print(f"| {size} | {percentile(to_reply, 0.5) * 1e3:.2f} | "
              f"{percentile(model, 0.5) * 1e3:.2f} | {percentile(own, 0.5) * 1e3:.2f} | "
              f"{percentile(own, 0.99) * 1e3:.2f} | "
              f"{percentile(own, 0.5) / percentile(model, 0.5):.4f} | {called:.0%} |")
    for size, table in tables:
        print(f"\nWhere a turn's time goes, {size} stored messages (inclusive times; a model "
              "site's time is the model's):\n")
        print(table)


if __name__ == "__main__":
    main()
