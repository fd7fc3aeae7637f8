"""How long the garbage collector stops the daemon, before and after `freeze_start_up_heap`.

A process that has loaded torch, the model and the chat libraries holds some 400,000 objects
that live as long as it does. Every full collection walks them all with the GIL held: no reply
is sent, no engine step runs. `openclaw run` freezes them once its start is done.

Two measures, on the unfrozen heap first (the peer) and then on the frozen one, in one process:
- a full collection (`gc.collect()`), timed five times;
- every collection the interpreter starts by itself while the embedded engine answers chats on
  the event loop (timed with gc.callbacks), with the event loop's longest stall (a 1 ms ticker).

    .venv/bin/python bench/gc_pause.py [--chats 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import discord  # noqa: E402, F401  (what `openclaw run` imports, as it would)
import telegram  # noqa: E402, F401

from engine import AsyncLLM, SamplingParams  # noqa: E402
from openclaw import cli, gateway  # noqa: E402, F401
from openclaw.daemon import freeze_start_up_heap  # noqa: E402


class Pauses:
    """Each collection's generation and seconds, from gc.callbacks."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seen.append((info["generation"], time.perf_counter() - self._began))


def full_collections_ms(times: int = 5) -> list[float]:
    out = []
    for _ in range(times):
        began = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - began) * 1000)
    return out


async def chats_with_ticker(llm: AsyncLLM, chats: int) -> float:
    """Answer `chats` chats at once; the event loop's longest stall, in ms, meanwhile."""
    worst = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last - 0.001)
            last = now

    async def chat(i: int) -> None:
        messages = [{"role": "user", "content": f"Write three sentences about the number {i}."}]
        await llm.chat(messages, SamplingParams(max_tokens=48, temperature=0.0))

    ticking = asyncio.create_task(ticker())
    await asyncio.gather(*(chat(i) for i in range(chats)))
    done.set()
    await ticking
    return worst * 1000


def run_phase(name: str, llm: AsyncLLM, chats: int) -> dict:
    pauses = Pauses()
    full = full_collections_ms()
    gc.callbacks.append(pauses)
    try:
        stall = asyncio.run(chats_with_ticker(llm, chats))
    finally:
        gc.callbacks.remove(pauses)
    by_gen = {g: [s * 1000 for gen, s in pauses.seen if gen == g] for g in (0, 1, 2)}
    print(f"{name:>9} | {statistics.median(full):11.3f} | {max(full):11.3f} | "
          + " | ".join(f"{len(v):6d} x {max(v, default=0):6.2f}" for v in by_gen.values())
          + f" | {stall:13.1f}")
    return {"full": statistics.median(full), "stall": stall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=8)
    args = parser.parse_args()
    llm = AsyncLLM()
    try:
        print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
              f"{len(gc.get_objects())} objects tracked after the start")
        print("     heap | full p50 ms | full max ms | gen0 n x max ms | gen1 n x max ms | "
              "gen2 n x max ms | loop stall ms")
        before = run_phase("unfrozen", llm, args.chats)
        frozen = freeze_start_up_heap()
        after = run_phase("frozen", llm, args.chats)
        # Frozen, a full collection can take under 10 us: the ratio's floor is 10 us, so ">=".
        print(f"# {frozen} objects frozen; a full collection: {before['full']:.1f} ms unfrozen, "
              f"{after['full'] * 1000:.0f} us frozen (>= {before['full'] / max(after['full'], 0.01):.0f}x "
              f"shorter); longest loop stall {before['stall']:.1f} -> {after['stall']:.1f} ms")
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
