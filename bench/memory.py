"""Long-term memory: how long a recall takes as a user's memory grows, and what memory adds to a
turn.

1. Recall latency (Store.recall: the pinned entries plus the 8 most relevant by FTS5 bm25) at
   10k and 100k entries of one user on SQLite (a real WAL file), for queries of ten words drawn
   like the entries' own (a Zipf-like vocabulary of 5,000 words), p50 and p99.
2. The agent turn with memory on against off (the peer, in the same run): the daemon as
   bench/agent_overhead.py drives it (a scripted model answering at once, so a turn is all
   overhead), the user holding 500 entries, 5 pinned. Target: under 2 ms added at p50.

    .venv/bin/python bench/memory.py [--sizes 10000,100000] [--queries 300] [--turns 300]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import insert  # noqa: E402

from openclaw.config import load_config  # noqa: E402
from openclaw.daemon import Daemon  # noqa: E402
from openclaw.gateway.contract import InboundMessage  # noqa: E402
from openclaw.store import Store  # noqa: E402
from openclaw.store.memory import digest  # noqa: E402
from openclaw.store.memory_records import EVERYWHERE, PRIVATE  # noqa: E402
from openclaw.store.models import MemoryRow  # noqa: E402
from tests.helpers.daemon import RecordingConnector  # noqa: E402
from tests.helpers.scripted_model import ScriptedModel  # noqa: E402

USER = "terminal:local"
rng = random.Random(7)
VOCABULARY = ["".join(rng.choice("abcdefghijklmnoprstuvw") for _ in range(rng.randint(3, 9)))
              for _ in range(5000)]
WEIGHTS = [1 / (rank + 1) for rank in range(len(VOCABULARY))]  # Zipf: a few words are common


def sentence(words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, WEIGHTS, k=words))


async def fill(store: Store, entries: int, pinned: int = 5) -> None:
    """`entries` of the user's, by Core executemany (the FTS5 triggers index each row)."""
    now = datetime.now(UTC)
    rows = [{"number": n + 1, "user_key": USER, "scope": PRIVATE, "kind": "fact",
             "text": (text := sentence(rng.randint(8, 15))), "digest": digest(text),
             "source": None, "pinned": n < pinned, "created_at": now}
            for n in range(entries)]
    async with store.engine.begin() as conn:
        for start in range(0, len(rows), 10_000):
            await conn.execute(insert(MemoryRow.__table__), rows[start:start + 10_000])


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.99) - 1] * 1e3


async def recall_latency(entries: int, queries: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        async with await Store.open(f"sqlite+aiosqlite:///{tmp}/m.db") as store:
            started = time.perf_counter()
            await fill(store, entries)
            filled = time.perf_counter() - started
            samples = []
            for _ in range(queries):
                query = sentence(10)
                start = time.perf_counter()
                await store.recall(USER, (PRIVATE, EVERYWHERE), query, limit=8)
                samples.append(time.perf_counter() - start)
            return (*percentiles(samples), filled)


def reply(messages: list[dict]) -> str:
    return "Here is a short answer to your question, with a few words in it."


async def turn_times(memory_on: bool, turns: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text(f'data_dir = "{tmp}"\n[admin]\nenabled = false\n'
                       f"[memory]\nenabled = {'true' if memory_on else 'false'}\n")
        config = load_config(cfg)
        async with await Store.open(config.store.url) as store:
            await fill(store, 500)
        model = ScriptedModel(reply, max_model_len=8192, chunk=1 << 20)
        conn = RecordingConnector()
        daemon = Daemon(config, model=model, connectors=[conn])
        await daemon.start()
        ids, sent_at, send = itertools.count(), [], conn.send_text

        async def timed_send(chat_id: str, text: str) -> str:
            sent_at.append(time.perf_counter())
            return await send(chat_id, text)

        conn.send_text = timed_send
        samples = []
        for i in range(turns):
            if i % 20 == 0:  # a short conversation each time: the prompt stays small
                await conn.handler(InboundMessage("terminal", "local", "local", f"n{i}", "/new"))
                await daemon.gateway.wait_idle()
            start = time.perf_counter()
            await conn.handler(InboundMessage("terminal", "local", "local", f"m{next(ids)}",
                                              sentence(10)))
            await daemon.gateway.wait_idle()
            samples.append(sent_at[-1] - start)
        await daemon.stop()
        return samples


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print("| entries of one user | recall p50 ms | recall p99 ms | filled in s |")
    print("|---:|---:|---:|---:|")
    for size in map(int, args.sizes.split(",")):
        p50, p99, filled = await recall_latency(size, args.queries)
        print(f"| {size:,} | {p50:.2f} | {p99:.2f} | {filled:.1f} |")
    await turn_times(False, 20)  # warm-up: imports, first compiles
    off = await turn_times(False, args.turns)
    on = await turn_times(True, args.turns)
    (off50, off99), (on50, on99) = percentiles(off), percentiles(on)
    print("\n| agent turn until the reply is sent | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    print(f"| memory off (peer) | {off50:.2f} | {off99:.2f} |")
    print(f"| memory on, 500 entries | {on50:.2f} | {on99:.2f} |")
    print(f"\nadded at p50: {on50 - off50:.2f} ms (target < 2); on/off ratio {on50 / off50:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
