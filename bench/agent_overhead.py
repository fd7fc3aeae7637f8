"""Time the daemon spends per turn outside the model: gateway, store, prompt building, parsing.

The headline figure is the time until the reply is handed to the connector (what the user waits);
the bookkeeping after it (delivery status, usage, marking the message processed) is shown apart.

A scripted model answers instantly (one streamed chunk), so a turn's wall time is all overhead:
access check, inbound insert (dedupe), the serial lane, prompt assembly from SQLite with token
counting, tool-call parsing, three message/usage/outbound writes, delivery. Half the turns make one
tool call (clock), as an agent's would. The peer, measured in the same run, is the embedded
engine's time to first token for a short chat prompt: the overhead should be a small fraction of it.

    .venv/bin/python bench/agent_overhead.py [--turns 400] [--quick] [--store-calls]
Target: p50 under 5 ms. `--store-calls` also prints each Store method's share of a turn (wall time
while it was awaited: where the store, usually most of the overhead, spends it).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw.config import load_config  # noqa: E402
from openclaw.daemon import Daemon  # noqa: E402
from openclaw.gateway.contract import InboundMessage  # noqa: E402
from tests.helpers.daemon import RecordingConnector  # noqa: E402
from tests.helpers.scripted_model import ScriptedModel  # noqa: E402


def scripted_reply(messages: list[dict]) -> str:
    if "You write the memory" in messages[0]["content"]:  # compaction of old turns
        return "The user asked numbered questions; each was answered."
    last = messages[-1]
    wants_tool = last["role"] == "user" and int(last["content"].split()[-1]) % 2 == 0
    if wants_tool:
        return '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
    return "Here is a short answer to your question, with a few words in it."


async def measure_overhead(turns: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text(f'data_dir = "{tmp}"\n[admin]\nenabled = false\n'
                       "[agent]\ncompaction_keep_messages = 8\n")
        model = ScriptedModel(scripted_reply, max_model_len=8192, chunk=1 << 20)
        conn = RecordingConnector()
        daemon = Daemon(load_config(cfg), model=model, connectors=[conn])
        await daemon.start()
        ids = itertools.count()
        sent_at: list[float] = []
        send = conn.send_text

        async def timed_send(chat_id: str, text: str) -> str:
            sent_at.append(time.perf_counter())
            return await send(chat_id, text)

        conn.send_text = timed_send
        to_reply, whole = [], []
        for i in range(turns):
            msg = InboundMessage("terminal", "local", "local", f"m{next(ids)}",
                                 f"please answer question number {i}")
            start = time.perf_counter()
            await conn.handler(msg)
            await daemon.gateway.wait_idle()
            whole.append(time.perf_counter() - start)
            to_reply.append(sent_at[-1] - start)
        await daemon.stop()
        return to_reply, whole


def measure_engine_ttft(repeats: int) -> float:
    from engine import LLM, SamplingParams

    llm = LLM(kv_cache_gib=0.25)
    messages = [{"role": "system", "content": "You are OpenClaw, a helpful personal assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.chat(messages, params)  # warm-up
    llm.engine.block_manager.reset_prefix_cache()
    samples = []
    for _ in range(repeats):
        llm.engine.block_manager.reset_prefix_cache()  # a fresh prompt each time, as a new user's
        start = time.perf_counter()
        llm.chat(messages, params)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def time_store_calls() -> dict[str, list[float]]:
    """Wrap each public coroutine method of Store with a timer; returns {name: [seconds, calls]}."""
    from openclaw.store import Store

    spent: dict[str, list[float]] = {}

    def timed(name: str, method):
        async def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                entry = spent.setdefault(name, [0.0, 0])
                entry[0] += time.perf_counter() - start
                entry[1] += 1
        return wrapper

    for name, method in list(vars(Store).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(method):
            setattr(Store, name, timed(name, method))
    return spent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="50 turns, for a smoke run")
    parser.add_argument("--store-calls", action="store_true", help="time each Store method too")
    args = parser.parse_args()
    turns = 50 if args.quick else args.turns
    store_calls = time_store_calls() if args.store_calls else None
    to_reply, whole = asyncio.run(measure_overhead(turns))
    to_reply, whole = to_reply[10:], whole[10:]  # the first turns include lazy imports, warm-up
    p50, p99 = percentile(to_reply, 0.5) * 1e3, percentile(to_reply, 0.99) * 1e3
    ttft = measure_engine_ttft(5) * 1e3
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"turns: {len(to_reply)} measured (half with one tool call)\n")
    print("| what | ms |")
    print("|---|---|")
    print(f"| agent overhead until the reply is sent, p50 | {p50:.2f} |")
    print(f"| agent overhead until the reply is sent, p99 | {p99:.2f} |")
    print(f"| whole turn incl. bookkeeping after the send, p50 | {percentile(whole, 0.5) * 1e3:.2f} |")
    print(f"| whole turn incl. bookkeeping after the send, p99 | {percentile(whole, 0.99) * 1e3:.2f} |")
    print(f"| peer: engine time to first token (embedded model, CPU) | {ttft:.1f} |")
    print(f"\noverhead p50 / engine TTFT = {p50 / ttft:.3f}")
    print(f"target p50 < 5 ms: {'PASS' if p50 < 5 else 'FAIL'}")
    if store_calls:
        print(f"\nStore calls over the {turns} turns (start-up included), by wall time while awaited:\n")
        print("| Store method | calls | ms per turn | us per call |")
        print("|---|---:|---:|---:|")
        for name, (seconds, calls) in sorted(store_calls.items(), key=lambda kv: -kv[1][0]):
            print(f"| {name} | {calls} | {seconds / turns * 1e3:.3f} | {seconds / calls * 1e6:.0f} |")


if __name__ == "__main__":
    main()
