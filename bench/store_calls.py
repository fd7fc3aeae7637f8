"""The store's per-turn calls alone, each way, in one process: on the event loop's writer
(store/loop_writer.py) and on the driver's thread (Store.open loop_writes=False), alternated
round by round so that both see the same load. Per call: p50 and p99 in microseconds.

    .venv/bin/python bench/store_calls.py [--calls 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from openclaw.store import Store

CALLS = ("record_inbound", "add_message", "add_reply", "mark_sent", "add_usage")


async def _round(db: Path, loop_writes: bool, calls: int, start: int,
                 seen: dict[str, list[float]]) -> None:
    async with await Store.open(f"sqlite:///{db}", loop_writes=loop_writes) as store:
        user = await store.ensure_user("telegram", 1001)
        conv = await store.active_conversation(user.key, "1001")
        clock = time.perf_counter
        for i in range(start, start + calls):
            t0 = clock()
            event, _ = await store.record_inbound("telegram", i, user.key, "1001", f"question {i}")
            t1 = clock()
            await store.add_message(conv.id, "user", f"question {i}", token_count=4)
            t2 = clock()
            pieces = await store.add_reply("telegram", "1001", [f"answer {i}"],
                                           conversation_id=conv.id, answers=event.id)
            t3 = clock()
            await store.mark_sent(pieces[0].id, i)
            t4 = clock()
            await store.add_usage(user.key, 100, 20, conversation_id=conv.id)
            t5 = clock()
            for name, (a, b) in zip(CALLS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)),
                                    strict=True):
                seen[name].append((b - a) * 1e6)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300, help="turns' worth of calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per way, alternated")
    args = parser.parse_args()
    results: dict[bool, dict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for loop_writes in (False, True):
                await _round(Path(folder) / f"{loop_writes}.db", loop_writes, args.calls,
                             r * args.calls, results[loop_writes])
    print(f"{'call':<16} {'thread p50':>11} {'p99':>8} {'loop p50':>9} {'p99':>8}  (us)")
    for name in CALLS:
        thread, loop = results[False][name], results[True][name]
        print(f"{name:<16} {statistics.median(thread):>11.1f} {_p(thread, 0.99):>8.1f} "
              f"{statistics.median(loop):>9.1f} {_p(loop, 0.99):>8.1f}")
    turn = {w: [sum(v[i] for v in results[w].values()) for i in range(len(results[w]["add_usage"]))]
            for w in (False, True)}
    print(f"{'the five':<16} {statistics.median(turn[False]):>11.1f} {_p(turn[False], 0.99):>8.1f} "
          f"{statistics.median(turn[True]):>9.1f} {_p(turn[True], 0.99):>8.1f}")


if __name__ == "__main__":
    asyncio.run(main())
