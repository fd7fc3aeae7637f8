"""Counters the engine keeps for itself (no metrics library in engine/): latency histograms
that a scrape exports as they are (openclaw/metrics.py reads LLMEngine.stats())."""

from __future__ import annotations

import bisect
from typing import Any

# Upper bounds in seconds, as a Prometheus histogram's `le`: from a cached prompt on a GPU
# (a millisecond) to a long prompt queued behind others on a CPU (minutes).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
# Per output token: a GPU decode step (milliseconds) to a busy CPU (a second or more).
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class Histogram:
    """Observations counted per bucket (not cumulative); the last count is the +Inf bucket."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1  # the first bound >= value
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        """A copy, so a reader's view does not move under it."""
        return {"buckets": list(self.buckets), "counts": list(self.counts), "sum": self.sum,
                "count": self.count}
