"""Token counting and prompt building per turn, alone: the agent's ContextBuilder over a history
kept in memory (no store, no model call), counting with the embedded engine's tokenizer as the
daemon does. Two ways, alternated in one process: `whole`, every count renders the chat template
(ChatModel.count_chat only, as before issue 30's third round), and `message`, a new message
counted by the engine's count_message (engine/chat_count.py), as LocalBackend counts.

A turn here is what the agent asks of the context before each model call: the user's message
checked against the budget and counted alone, the prompt built; every other turn makes one tool
call (the call and its result, then a second build), as in bench/agent_overhead.py.

    .venv/bin/python bench/prompt_counting.py [--turns 300] [--history 10,500] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw.agent.context import Budget, ContextBuilder  # noqa: E402
from openclaw.store.records import Message  # noqa: E402
from tests.helpers.scripted_model import ScriptedModel  # noqa: E402

SYSTEM = "You are OpenClaw, a helpful personal assistant."
TOOLS = [{"type": "function", "function": {
    "name": "clock", "description": "The date and time now, in a time zone",
    "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "description": "an IANA zone, e.g. Europe/Paris"}}}}}]
ANSWER = "Here is a short answer to your question, with a few words in it."
WARM_UP = 10


class History:
    """One conversation's messages in memory: what ContextBuilder asks of a store."""

    def __init__(self, size: int) -> None:
        self.ids = itertools.count(1)
        self.messages = [self._message("user" if i % 2 == 0 else "assistant",
                                       f"message {i} of the history") for i in range(size)]

    def _message(self, role: str, content: str, tool_calls=None, tool_call_id=None) -> Message:
        return Message(next(self.ids), 1, role, content, tool_calls, tool_call_id, None,
                       datetime.now())

    async def add_message(self, conversation_id, role, content, *, tool_calls=None,
                          tool_call_id=None, **_) -> Message:
        self.messages.append(self._message(role, content, tool_calls, tool_call_id))
        return self.messages[-1]

    async def set_token_count(self, message_id: int, tokens: int) -> None:
        pass  # the counts this bench measures are the prompt's

    async def add_messages(self, conversation_id, messages, audit=None) -> list[Message]:
        return [await self.add_message(conversation_id, **message) for message in messages]

    async def list_messages(self, conversation_id, after_id=None) -> list[Message]:
        return list(self.messages)

    async def add_summary(self, *args):
        raise RuntimeError("the budget is sized so that nothing is compacted")

    async def latest_summary(self, conversation_id):
        return None


def models(engine):
    class Whole(ScriptedModel):
        async def count_chat(self, messages, tools=None, tool_instructions=None) -> int:
            return len(engine.encode_chat(messages, tools))

    class PerMessage(Whole):
        def count_message(self, message: dict, after: dict) -> int:
            return engine.count_message(message, after)

    return {"whole": Whole, "message": PerMessage}


async def per_turn(model_cls, history: int, turns: int) -> list[float]:
    """Seconds of counting and building in each turn after the warm-up."""
    store = History(history)
    context = ContextBuilder(model_cls(lambda m: ANSWER, max_model_len=1 << 20), store, SYSTEM,
                             Budget(prompt_tokens=1 << 19, keep_messages=8))
    await context.build(1, TOOLS)  # the history read and counted whole, as at a daemon's start
    spent = []
    for i in range(turns + WARM_UP):
        text = f"please answer question number {i}"
        start = time.perf_counter()
        assert await context.fits_alone(text, TOOLS)
        await context.counter.alone({"role": "user", "content": text})
        took = time.perf_counter() - start
        await context.add(1, "user", text)
        steps = 2 if i % 2 == 0 else 1
        for step in range(steps):
            start = time.perf_counter()
            await context.build(1, TOOLS)
            took += time.perf_counter() - start
            if step + 1 < steps:
                call = [{"id": f"c{i}", "type": "function",
                         "function": {"name": "clock", "arguments": "{}"}}]
                await context.add(1, "assistant", "", tool_calls=call)
                await context.add(1, "tool", f"2026-12-07 18:{i % 60:02d} UTC", tool_call_id=f"c{i}")
        await context.add(1, "assistant", ANSWER)
        if i >= WARM_UP:
            spent.append(took)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--history", default="10,500")
    parser.add_argument("--rounds", type=int, default=2, help="each way run this many times, in turn")
    args = parser.parse_args()
    from engine import LLM

    engine = LLM(kv_cache_gib=0.05).engine
    ways = models(engine)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.turns} turns "
          "per run, half with one tool call\n")
    print("| round | counting | stored messages | ms a turn, p50 | mean | p99 |")
    print("|---:|---|---:|---:|---:|---:|")
    for round_ in range(args.rounds):
        for name, cls in ways.items():
            for size in (int(n) for n in args.history.split(",")):
                spent = sorted(asyncio.run(per_turn(cls, size, args.turns)))
                p99 = spent[min(len(spent) - 1, int(0.99 * len(spent)))]
                print(f"| {round_ + 1} | {name} | {size} | {statistics.median(spent) * 1e3:.3f} | "
                      f"{statistics.mean(spent) * 1e3:.3f} | {p99 * 1e3:.3f} |")
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
