"""Counters, histograms and gauges, rendered in Prometheus' text format for the admin port's
/metrics.

Small on purpose: a dict of series, no client library. Gauges are read from callbacks at scrape
time (queue length, KV usage), so they are never stale. A value observed under a name registered
with `histogram` goes into its buckets (for latency percentiles in Prometheus); under any other
name it is a summary of count and sum.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

# Seconds, for what a user waits on: a first token (tens of ms on a GPU), a tool, a whole turn.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# Seconds the event loop was late, for /metrics: a millisecond is normal, a tenth of a second is
# a stall every chat felt.
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOOP_LAG_EVERY_S = 0.5
LOOP_LAG = "openclaw_event_loop_lag_seconds"


@dataclass
class _Histogram:
    bounds: tuple[float, ...]  # upper bounds, ascending; +Inf is implied
    counts: list[int]  # per bucket (not cumulative), the last one for +Inf
    total: float = 0.0


@dataclass
class Metrics:
    counters: dict[tuple[str, Labels], float] = field(default_factory=dict)
    summaries: dict[str, list[float]] = field(default_factory=dict)  # name -> [count, sum]
    histograms: dict[str, _Histogram] = field(default_factory=dict)
    gauges: dict[str, Callable[[], float]] = field(default_factory=dict)
    help: dict[str, str] = field(default_factory=dict)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + value

    def histogram(self, name: str, buckets: Sequence[float] = LATENCY_BUCKETS,
                  help_text: str = "") -> None:
        """Observe `name` into these buckets from now on (again: nothing changes)."""
        if name not in self.histograms:
            bounds = tuple(sorted(buckets))
            self.histograms[name] = _Histogram(bounds, [0] * (len(bounds) + 1))
        if help_text:
            self.help[name] = help_text

    def observe(self, name: str, value: float) -> None:
        hist = self.histograms.get(name)
        if hist is not None:
            hist.counts[bisect.bisect_left(hist.bounds, value)] += 1  # le: a bound is inclusive
            hist.total += value
            return
        count_sum = self.summaries.setdefault(name, [0.0, 0.0])
        count_sum[0] += 1
        count_sum[1] += value

    def gauge(self, name: str, read: Callable[[], float], help_text: str = "") -> None:
        self.gauges[name] = read
        if help_text:
            self.help[name] = help_text

    def value(self, name: str, **labels: str) -> float:
        return self.counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        for name in sorted({n for n, _ in self.counters}):
            lines += self._header(name, "counter")
            for (n, labels), value in sorted(self.counters.items()):
                if n == name:
                    lines.append(f"{name}{_labels(labels)} {value:g}")
        for name, (count, total) in sorted(self.summaries.items()):
            lines += [*self._header(name, "summary"), f"{name}_count {count:g}",
                      f"{name}_sum {total:g}"]
        for name, hist in sorted(self.histograms.items()):
            lines += self._header(name, "histogram")
            cumulative = 0
            for bound, count in zip((*hist.bounds, math.inf), hist.counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == math.inf else repr(float(bound))  # "1.0", as Prometheus writes it
                lines.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
            lines += [f"{name}_count {cumulative}", f"{name}_sum {hist.total:g}"]
        for name, read in sorted(self.gauges.items()):
            try:
                value = float(read())
            except Exception:  # a gauge that cannot be read is left out, not a failed scrape
                continue
            lines += [*self._header(name, "gauge"), f"{name} {value:g}"]
        return "\n".join(lines) + "\n"

    def _header(self, name: str, kind: str) -> list[str]:
        help_line = [f"# HELP {name} {self.help[name]}"] if name in self.help else []
        return [*help_line, f"# TYPE {name} {kind}"]


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def follow_loop_lag(metrics: Metrics, every_s: float | None = None) -> None:
    """Until cancelled, how late the event loop wakes a sleep of `every_s` (LOOP_LAG_EVERY_S),
    into the histogram LOOP_LAG: how long every chat waited on whatever held the loop (a full
    garbage collection, a slow callback, blocking work that belongs in a thread)."""
    every_s = LOOP_LAG_EVERY_S if every_s is None else every_s
    metrics.histogram(LOOP_LAG, LOOP_LAG_BUCKETS, "how late the event loop woke a sleep: "
                      "every chat waited that long")
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        await asyncio.sleep(every_s)
        metrics.observe(LOOP_LAG, max(loop.time() - began - every_s, 0.0))
