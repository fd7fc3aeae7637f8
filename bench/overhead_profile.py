"""Where a turn's overhead goes, for bench/agent_overhead.py --profile: each call site wrapped with
a timer (count and wall time while it ran), the event loop's iterations and the trips to SQLite's
driver thread counted. Times are inclusive: a site's time holds the sites it calls (the table says
which), and a store call's time holds its waits for the driver thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

# (label, class path, attribute, what its time includes). Patched on the class, so every instance
# the daemon makes is timed.
SITES: list[tuple[str, str, str, str]] = [
    ("gateway.handle (admit + record_inbound + queue)", "openclaw.gateway.gateway:Gateway",
     "handle", "access.admit, store.record_inbound"),
    ("access.admit (policy, on arrival)", "openclaw.gateway.access:Access", "admit", ""),
    ("access.still_allowed (policy, per tool step)", "openclaw.gateway.access:Access",
     "still_allowed", ""),
    ("policy.principal (role, workspace)", "sandbox.policy:Policy", "principal", ""),
    ("lanes.conversation (active conversation)", "openclaw.gateway.lanes:Lanes", "conversation",
     ""),
    ("spending.today (daily-token check)", "openclaw.gateway.turn:Spending", "today", ""),
    ("agent._memory (recall for the prompt)", "openclaw.agent.loop:Agent", "_memory",
     "store.recall, counting"),
    ("context.build (prompt building)", "openclaw.agent.context:ContextBuilder", "build",
     "model.count_chat of the prompt"),
    ("context.add (message stored, cache kept)", "openclaw.agent.context:ContextBuilder", "add",
     "store.add_message"),
    ("executor.call (tool: policy, run, audit)", "skills.executor:Executor", "call",
     "store.add_audit"),
    ("outbox.send (store reply, deliver)", "openclaw.gateway.outbox:Outbox", "send",
     "store.add_reply, connector send, store.mark_outbound"),
    ("spending.end (usage written after the send)", "openclaw.gateway.turn:Spending", "end",
     "store.add_usage"),
    ("metrics.inc", "openclaw.metrics:Metrics", "inc", ""),
    ("metrics.observe", "openclaw.metrics:Metrics", "observe", ""),
]


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


class Profile:
    """Counts and times per site, patched in by `install`, read with `table`."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {}  # label: [seconds, calls]
        self.notes: dict[str, str] = {}
        self.loop_iterations = 0
        self.thread_trips = 0
        self.turns = 0

    def _add(self, label: str, seconds: float) -> None:
        entry = self.spent.setdefault(label, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1

    def _wrap(self, label: str, method: Callable) -> Callable:
        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await method(*args, **kwargs)
                finally:
                    self._add(label, time.perf_counter() - start)
            return timed_async

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._add(label, time.perf_counter() - start)
        return timed

    def install(self, model_cls: type) -> None:
        """Wrap the sites, every public Store call, the model's count_chat, and count the driver
        thread's trips (aiosqlite's queue: one per statement with our driver)."""
        from openclaw.store import Store

        for label, path, attribute, includes in SITES:
            cls = _resolve(path)
            setattr(cls, attribute, self._wrap(label, getattr(cls, attribute)))
            self.notes[label] = includes
        for name, method in list(vars(Store).items()):
            if not name.startswith("_") and inspect.iscoroutinefunction(method):
                setattr(Store, name, self._wrap(f"store.{name}", method))
        model_cls.count_chat = self._wrap("model.count_chat (token counting)", model_cls.count_chat)
        if hasattr(model_cls, "count_message"):
            model_cls.count_message = self._wrap("model.count_message (a new message alone)",
                                                 model_cls.count_message)
        if hasattr(model_cls, "bound_message"):
            model_cls.bound_message = self._wrap("model.bound_message (its bound, not encoded)",
                                                 model_cls.bound_message)
        try:
            import aiosqlite
        except ImportError:
            return
        execute = aiosqlite.Connection._execute

        async def counted(connection: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            self.thread_trips += 1
            return await execute(connection, fn, *args, **kwargs)

        aiosqlite.Connection._execute = counted

    def count_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count the loop's iterations: each is a hop (a task woken, a callback run)."""
        run_once = loop._run_once  # type: ignore[attr-defined]

        def counted() -> None:
            self.loop_iterations += 1
            run_once()

        loop._run_once = counted  # type: ignore[attr-defined]

    def reset(self) -> None:
        self.spent.clear()
        self.loop_iterations = self.thread_trips = self.turns = 0

    def table(self) -> str:
        turns = max(self.turns, 1)
        rows = ["| site | calls per turn | us per call | ms per turn | its time includes |",
                "|---|---:|---:|---:|---|"]
        for label, (seconds, calls) in sorted(self.spent.items(), key=lambda kv: -kv[1][0]):
            rows.append(f"| {label} | {calls / turns:.2f} | {seconds / calls * 1e6:.0f} | "
                        f"{seconds / turns * 1e3:.3f} | {self.notes.get(label, '')} |")
        rows.append(f"| event-loop iterations | {self.loop_iterations / turns:.1f} | | | |")
        rows.append(f"| trips to the SQLite driver thread | {self.thread_trips / turns:.1f} | | | |")
        return "\n".join(rows)
