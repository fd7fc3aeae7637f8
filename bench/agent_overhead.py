"""Time the daemon spends per turn outside the model: gateway, store, prompt building, parsing.

The headline figure is the time until the reply is handed to the connector (what the user waits);
the whole turn adds the bookkeeping after it (delivery status, usage). Both are measured in a
conversation that holds 10 stored messages, then in one that holds 500, to show whether a turn's
cost grows with the history.

A scripted model answers instantly (one streamed chunk), so a turn's wall time is all overhead:
access check, inbound insert (dedupe), the serial lane, memory recall, prompt assembly with token
counting (by the embedded engine's own tokenizer, as the daemon counts; `--count words` for the
scripted model's word count), tool-call parsing, the message, reply and usage writes, delivery.
Half the turns make one tool call (clock), as an agent's would. The peer, measured in the same
run, is the embedded engine's time to first token for a short chat prompt.

    .venv/bin/python bench/agent_overhead.py [--turns 200] [--quick] [--profile]
        [--history 10,500] [--count engine|engine-whole|words]
        [--store-url postgresql+asyncpg://USER@HOST:PORT/openclaw_{history}]
Targets (issue 30): p50 until the reply is handed to the connector < 1 ms and at most 0.02 of the
engine's TTFT; p99 < 5 ms; no growth with the history. `--profile` prints where a turn's time goes
(bench/overhead_profile.py): each site's calls and time per turn, loop iterations, driver trips.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.overhead_profile import Profile  # noqa: E402
from openclaw.config import load_config  # noqa: E402
from openclaw.daemon import Daemon  # noqa: E402
from openclaw.gateway.contract import InboundMessage  # noqa: E402
from openclaw.store.memory_records import PRIVATE  # noqa: E402
from tests.helpers.daemon import RecordingConnector  # noqa: E402
from tests.helpers.scripted_model import ScriptedModel  # noqa: E402

# Asked in turn: each unlike the one before, as a user's messages are. One question again and
# again (a number apart) reads as a retry to the feedback check (openclaw/gateway/feedback.py),
# which then grades the previous turn on every message: two store calls no ordinary turn makes.
QUESTIONS = ("please answer question number {}", "what is the weather in town {}",
             "tell me a fact about item {}", "how long does it take to cook recipe {}",
             "please summarise chapter {}")
ANSWER = "Here is a short answer to your question, with a few words in it."
WARM_UP = 10  # turns not measured: lazy imports, caches filled
# The first question's number in each run: every run asks its own, as users' messages are new
# text (the engine's tokenizer keeps what it encoded: a question asked in an earlier run would
# cost a look-up). Even, so that the even questions are still the ones that want the clock.
FIRST_QUESTIONS = itertools.count(0, 1_000_000)


def question(i: int) -> str:
    return QUESTIONS[i % len(QUESTIONS)].format(i)


def scripted_reply(messages: list[dict]) -> str:
    if "You write the memory" in messages[0]["content"]:  # compaction of old turns
        return "The user asked numbered questions; each was answered."
    last = messages[-1]
    wants_tool = last["role"] == "user" and int(last["content"].split()[-1]) % 2 == 0
    if wants_tool:
        return '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
    return ANSWER


class Answering(ScriptedModel):
    """The scripted model, reporting its prompt's size without reading the prompt: the engine
    reads it in its prefill, which is the model's time (the peer's TTFT), not the daemon's. (Its
    word count walks every message: at 500 stored ones, a fifth of a turn's time here.) It stands
    in for the engine, which runs requests by their priority itself: the daemon puts no priority
    gate in front of it (openclaw/scheduler/priority_gate.py, for a remote model)."""

    orders_by_priority = True

    def prompt_tokens(self, prompt: list[dict], tools: list[dict] | None) -> int:
        return len(prompt)


class TokenizerCounted(Answering):
    """The scripted model, counting prompts for the agent as the embedded engine does (its
    tokenizer and chat template), so prompt building costs what it costs in the daemon. Its own
    answers count words: the engine encoding the prompt it was given is the model's time."""

    def __init__(self, encode, **kwargs) -> None:
        super().__init__(scripted_reply, **kwargs)
        self.encode = encode

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        return len(self.encode(messages, tools))


class MessageCounted(TokenizerCounted):
    """Counting as LocalBackend counts: a new message by the engine's count_message (encoded
    alone, no template rendering: engine.chat_count) and bound_message (no encoding), a whole
    prompt by its encode_chat."""

    def __init__(self, encode, engine, **kwargs) -> None:
        super().__init__(encode, **kwargs)
        self.engine = engine

    def count_message(self, message: dict, after: dict) -> int:
        return self.engine.count_message(message, after)

    def bound_message(self, message: dict, after: dict) -> int | None:
        return self.engine.bound_message(message, after)


# What the bench's user has told the assistant to remember (--memories): some share words with
# the questions, so a recall finds entries for most turns, as a user's memory would.
FACTS = ("the user lives in town {} near the river", "the user likes short answers, item {}",
         "recipe {} needs an hour in the oven", "the user reads chapter {} on Sundays",
         "the user's colleague number {} prefers email")


async def prefill(daemon: Daemon, count: int, memories: int = 0) -> None:
    """`count` stored messages (questions and answers) in the console's conversation, and
    `memories` entries in its user's memory."""
    store = daemon.store
    await store.ensure_user("terminal", "local")  # as the gateway's admission would
    conversation = await store.active_conversation("terminal:local", "local", "terminal")
    for i in range(count):
        role, text = ("user", question(-1 - i)) if i % 2 == 0 else ("assistant", ANSWER)
        await store.add_message(conversation.id, role, text, token_count=12)
    for i in range(memories):
        await store.add_memory("terminal:local", PRIVATE, FACTS[i % len(FACTS)].format(i))


def scripted_model(encode, counts=None) -> Callable[[], Any]:
    """The scripted model, counting as `--count` says (see measure_overhead)."""
    model_args = {"max_model_len": 65536, "chunk": 1 << 20}
    return lambda: (MessageCounted(encode, counts, **model_args) if counts is not None
                    else TokenizerCounted(encode, **model_args) if encode is not None
                    else Answering(scripted_reply, **model_args))


async def measure_overhead(turns: int, history: int, make_model: Callable[[], Any],
                           store_url: str | None = None, profile: Profile | None = None,
                           agent_config: str = "", memories: int = 0
                           ) -> tuple[list[float], list[float], list[float]]:
    """Per measured turn: seconds until the reply was handed to the connector, for the whole
    turn, and inside the model's streams before the reply (`model_part`: a model that keeps an
    `inside` total, else 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        store = f'[store]\nurl = "{store_url.format(history=history)}"\n' if store_url else ""
        # A context that holds the 500 messages and the turns after them: no compaction midway
        # (a summary every few turns would measure the model's summary, not the bookkeeping).
        cfg.write_text(f'data_dir = "{tmp}"\n[admin]\nenabled = false\n{store}'
                       f"[agent]\ncompaction_keep_messages = 8\n{agent_config}")
        model = make_model()
        conn = RecordingConnector()
        # As `openclaw run` makes it: what its start allocated frozen out of the collector.
        daemon = Daemon(load_config(cfg), model=model, connectors=[conn], freeze_heap=True)
        await daemon.start()
        await prefill(daemon, history, memories)
        ids = itertools.count()
        sent_at: list[float] = []
        send = conn.send_text

        async def timed_send(chat_id: str, text: str) -> str:
            sent_at.append(time.perf_counter())
            return await send(chat_id, text)

        conn.send_text = timed_send
        to_reply, whole, model_part = [], [], []
        first = next(FIRST_QUESTIONS)
        for i in range(turns + WARM_UP):
            if i == WARM_UP and profile is not None:
                profile.reset()
            msg = InboundMessage("terminal", "local", "local", f"m{next(ids)}",
                                 question(first + i))
            inside = getattr(model, "inside", 0.0)
            start = time.perf_counter()
            await conn.handler(msg)
            await daemon.gateway.wait_idle()
            whole.append(time.perf_counter() - start)
            to_reply.append(sent_at[-1] - start)
            model_part.append(getattr(model, "inside", 0.0) - inside)
        if profile is not None:
            profile.turns = turns
        await daemon.stop()
        return to_reply[WARM_UP:], whole[WARM_UP:], model_part[WARM_UP:]


def measure_engine_ttft(llm, repeats: int) -> float:
    from engine import SamplingParams

    messages = [{"role": "system", "content": "You are OpenClaw, a helpful personal assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.chat(messages, params)  # warm-up
    samples = []
    for _ in range(repeats):
        llm.engine.block_manager.reset_prefix_cache()  # a fresh prompt each time, as a new user's
        start = time.perf_counter()
        llm.chat(messages, params)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200, help="measured turns per history size")
    parser.add_argument("--quick", action="store_true", help="50 turns, for a smoke run")
    parser.add_argument("--history", default="10,500", help="stored messages before the turns")
    parser.add_argument("--count", choices=("engine", "engine-whole", "words"), default="engine",
                        help="count prompts with the engine's tokenizer (a new message by its "
                        "count_message, as the daemon counts; engine-whole: every count renders "
                        "the template, as before issue 30's third round), or the scripted words")
    parser.add_argument("--store-url", default=None, help="a PostgreSQL store, say (default: a "
                        "SQLite file in a temporary folder); {history} in it is replaced by the "
                        "history size, an empty database for each")
    parser.add_argument("--profile", action="store_true", help="where a turn's time goes")
    parser.add_argument("--memories", type=int, default=0, help="entries in the user's memory "
                        "(default none: the memory is then never read), recalled each turn")
    args = parser.parse_args()
    turns = 50 if args.quick else args.turns
    sizes = [int(n) for n in args.history.split(",")]

    from engine import LLM

    llm = LLM(kv_cache_gib=0.25)
    ttft = measure_engine_ttft(llm, 5) * 1e3
    encode = llm.engine.encode_chat if args.count != "words" else None
    counts = llm.engine if args.count == "engine" else None
    counted = (MessageCounted if counts is not None else TokenizerCounted
               if encode is not None else Answering)
    profile = Profile() if args.profile else None
    rows, tables = [], []
    # A whole daemon's run first, not measured: the process's first is ~8% slower (its
    # allocator's arenas, the caches the libraries fill on first use), and would favour the
    # size measured second. (Not on PostgreSQL: the database of a size is used once.)
    if args.store_url is None:
        asyncio.run(measure_overhead(WARM_UP * 5, sizes[0], scripted_model(encode, counts),
                                     memories=args.memories))
    for size in sizes:
        if profile is not None:
            profile.install(counted)
        to_reply, whole, _ = asyncio.run(with_loop_count(measure_overhead(
            turns, size, scripted_model(encode, counts), args.store_url, profile,
            memories=args.memories), profile))
        rows.append((size, to_reply, whole))
        if profile is not None:
            tables.append((size, profile.table()))
            profile = Profile()  # a fresh one per size, patched over the last (each counts its own)
    load = os.getloadavg()
    store = "PostgreSQL" if args.store_url else "SQLite (WAL, a file)"
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}; store: {store}; counting: {args.count}; memory entries: "
          f"{args.memories}")
    print(f"turns: {turns} measured per history size (half with one tool call), after "
          f"{WARM_UP} warm-up turns\n")
    print("| stored messages | to reply p50 | to reply p99 | whole turn p50 | whole turn p99 | "
          "p50 / engine TTFT | to reply p50: no tool / one tool call |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size, to_reply, whole in rows:
        p50 = percentile(to_reply, 0.5) * 1e3
        # Turn i asks question i, which wants the clock when i is even (scripted_reply).
        with_tool = [t for i, t in enumerate(to_reply, WARM_UP) if i % 2 == 0]
        without = [t for i, t in enumerate(to_reply, WARM_UP) if i % 2 == 1]
        print(f"| {size} | {p50:.2f} | {percentile(to_reply, 0.99) * 1e3:.2f} | "
              f"{percentile(whole, 0.5) * 1e3:.2f} | {percentile(whole, 0.99) * 1e3:.2f} | "
              f"{p50 / ttft:.3f} | {percentile(without, 0.5) * 1e3:.2f} / "
              f"{percentile(with_tool, 0.5) * 1e3:.2f} |")
    print(f"\npeer: engine time to first token (embedded model, CPU), median of 5: {ttft:.1f} ms")
    p50s = [percentile(r, 0.5) * 1e3 for _, r, _ in rows]
    p99s = [percentile(r, 0.99) * 1e3 for _, r, _ in rows]
    print(f"targets: p50 < 1 ms: {'PASS' if max(p50s) < 1 else 'FAIL'}; p50 <= 0.02 TTFT: "
          f"{'PASS' if max(p50s) <= 0.02 * ttft else 'FAIL'}; p99 < 5 ms: "
          f"{'PASS' if max(p99s) < 5 else 'FAIL'}")
    for size, table in tables:
        print(f"\nWhere a turn's time goes, {size} stored messages (inclusive times):\n")
        print(table)


async def with_loop_count(run, profile: Profile | None):
    if profile is not None:
        profile.count_loop(asyncio.get_running_loop())
    return await run


if __name__ == "__main__":
    main()
