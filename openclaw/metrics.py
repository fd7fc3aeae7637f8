"""Counters, histograms and gauges for /metrics, kept by prometheus_client in a registry of their own.

One `CollectorRegistry` per `Metrics` (a daemon, or `openclaw serve`), never the library's global
one: two daemons in one process (the tests run many) must not mix their counts. Gauges and the
engine's numbers are read from callbacks at scrape time, so they are never stale. A value observed
under a name registered with `histogram` goes into its buckets (for latency percentiles in
Prometheus); under any other name it is a summary of count and sum.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# The text format every Prometheus reads, which generate_latest writes (the library's own name for
# it, and its CONTENT_TYPE_LATEST, moved between versions).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The `_created` series (a timestamp per counter and histogram) mean something only in
# OpenMetrics; in the text format they are one more series each, which nothing reads. The switch
# is the library's, for the whole process: nothing else here uses prometheus_client.
disable_created_metrics()

# Seconds, for what a user waits on: a first token (tens of ms on a GPU), a tool, a whole turn.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# Seconds the event loop was late, for /metrics: a millisecond is normal, a tenth of a second is
# a stall every chat felt.
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOOP_LAG_EVERY_S = 0.5
MAX_CHILDREN = 4096  # counter children kept found (Metrics.inc); more are looked up each time
LOOP_LAG = "openclaw_event_loop_lag_seconds"

# What each counter counts, for its HELP line; a counter not named here has none.
COUNTER_HELP = {
    "openclaw_inbound_messages_total": "messages received, by channel",
    "openclaw_outbound_messages_total": "messages delivered, by channel",
    "openclaw_turns_total": "messages answered, by outcome",
    "openclaw_tool_calls_total": "tool calls, by skill and policy decision",
    "openclaw_prompt_tokens_total": "prompt tokens of the model calls",
    "openclaw_completion_tokens_total": "tokens the model generated in answers",
    "openclaw_config_reloads_total": "config reloads, by result",
    "openclaw_admin_connections_dropped_total": "admin port connections closed unserved: over "
                                                "the cap, the oldest that had sent no request",
}


class Metrics:
    """The series of one daemon (or server), rendered for /metrics by `render()`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._counters: dict[str, Counter] = {}
        # Each (name, labels) child, found once: labels() checks and locks at every call.
        self._children: dict[Any, Any] = {}
        self._histograms: dict[str, Histogram] = {}
        self._summaries: dict[str, Summary] = {}
        self._gauges = _CallbackGauges()
        self.registry.register(self._gauges)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Add to the counter `name` (ending in _total), by these labels; a name keeps the label
        names it was first used with (a different set is a ValueError)."""
        key = (name, *labels.items()) if labels else name
        child = self._children.get(key)
        if child is None:
            counter = self._counters.get(name)
            if counter is None:
                counter = self._counters[name] = Counter(
                    name, COUNTER_HELP.get(name, ""), sorted(labels), registry=self.registry)
            child = counter.labels(**labels) if labels else counter
            if len(self._children) < MAX_CHILDREN:
                self._children[key] = child
        child.inc(value)

    def histogram(self, name: str, buckets: Sequence[float] = LATENCY_BUCKETS,
                  help_text: str = "") -> None:
        """Observe `name` into these buckets from now on (again: nothing changes)."""
        if name in self._histograms:
            return
        if name in self._summaries:
            raise ValueError(f"{name} was observed as a summary before it was made a histogram")
        self._histograms[name] = Histogram(name, help_text, buckets=sorted(buckets),
                                           registry=self.registry)

    def observe(self, name: str, value: float) -> None:
        histogram = self._histograms.get(name)
        if histogram is not None:
            histogram.observe(value)  # le: a value on a bound counts in that bucket
            return
        summary = self._summaries.get(name)
        if summary is None:
            summary = self._summaries[name] = Summary(name, "", registry=self.registry)
        summary.observe(value)

    def gauge(self, name: str, read: Callable[[], float], help_text: str = "") -> None:
        """`name` is `read()` at each scrape; one that raises is left out of that scrape."""
        self._gauges.add(name, read, help_text)

    def add_engine(self, stats: Callable[[], Mapping[str, Any]], since: float | None = None) -> None:
        """Export the engine's own numbers (EngineCollector), read from `stats()` at each scrape;
        `since` (time.time()) is when generation began counting, for the average rate."""
        self.registry.register(EngineCollector(stats, since))

    def value(self, name: str, **labels: str) -> float:
        """A sample's value as a scrape would read it (a counter's `..._total`, a histogram's
        `..._count` or `..._bucket` with `le`); 0 when there is none."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def counter_series(self) -> int:
        """How many label sets the counters hold: a number that must stay bounded."""
        return sum(len(family.samples) for counter in self._counters.values()
                   for family in counter.collect())

    def render(self) -> str:
        return generate_latest(self.registry).decode()


def engine_metrics(stats: Callable[[], Mapping[str, Any]], since: float | None = None) -> Metrics:
    """The metrics of a bare engine (`openclaw serve`'s /metrics): its numbers and nothing else."""
    metrics = Metrics()
    metrics.add_engine(stats, since)
    return metrics


class _CallbackGauges(Collector):
    def __init__(self) -> None:
        self._gauges: dict[str, tuple[Callable[[], float], str]] = {}

    def add(self, name: str, read: Callable[[], float], help_text: str) -> None:
        self._gauges[name] = (read, help_text)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, (read, help_text) in sorted(self._gauges.items()):
            try:
                value = float(read())
            except Exception:  # a gauge that cannot be read is left out, not a failed scrape
                continue
            yield GaugeMetricFamily(name, help_text, value=value)

    def describe(self) -> list:
        return []  # read nothing at registration (the default would collect once)


# The engine's stats() keys and the series they become (engine/engine_core.py keeps the numbers).
ENGINE_GAUGES = {
    "num_running": ("openclaw_engine_running", "requests in the running batch"),
    "num_waiting": ("openclaw_engine_waiting", "requests queued for the batch"),
    "kv_usage": ("openclaw_kv_cache_usage", "fraction of KV blocks used"),
    "kv_blocks": ("openclaw_engine_kv_blocks", "KV cache blocks in all"),
    "kv_blocks_used": ("openclaw_engine_kv_blocks_used", "KV cache blocks held by requests"),
    "kv_blocks_cached": ("openclaw_engine_kv_blocks_cached",
                         "free KV cache blocks that still hold a cached prefix"),
    "generated_tokens": ("openclaw_generated_tokens", "tokens generated since start"),
    "kv_bytes_per_token": ("openclaw_kv_bytes_per_token", "KV cache bytes one token holds"),
    "kv_pool_tokens": ("openclaw_kv_pool_tokens", "tokens the KV pool holds (blocks x block size)"),
}
ENGINE_COUNTERS = {
    "prefix_cache_hit_tokens": ("openclaw_engine_prefix_cache_hit_tokens_total",
                                "prompt tokens served from the prefix cache"),
    "prefix_cache_query_tokens": ("openclaw_engine_prefix_cache_query_tokens_total",
                                  "prompt tokens looked up in the prefix cache"),
    "num_preemptions": ("openclaw_engine_preemptions_total",
                        "requests preempted for KV blocks (recomputed later)"),
    "num_requests_finished": ("openclaw_engine_requests_finished_total", "requests finished"),
}
ENGINE_HISTOGRAMS = {
    "ttft_seconds": ("openclaw_engine_time_to_first_token_seconds",
                     "a request's arrival to its first output token"),
    "tpot_seconds": ("openclaw_engine_time_per_output_token_seconds",
                     "a request's time per output token after the first"),
}


class EngineCollector(Collector):
    """The engine's numbers as series, from one `stats()` call per scrape. A key the engine does
    not report (an older engine, a remote backend) is simply not exported; stats() failing leaves
    the engine out of that scrape rather than failing it."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]], since: float | None = None) -> None:
        self._stats = stats
        self._since = time.time() if since is None else since

    def describe(self) -> list:
        return []  # stats() is read at scrape time only, never at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        try:
            stats = self._stats()
        except Exception:
            log.debug("the engine's stats could not be read for /metrics", exc_info=True)
            return
        for key, (name, help_text) in ENGINE_GAUGES.items():
            if (value := _number(stats.get(key))) is not None:
                yield GaugeMetricFamily(name, help_text, value=value)
        if (generated := _number(stats.get("generated_tokens"))) is not None:
            yield GaugeMetricFamily("openclaw_tokens_per_second", "average generation rate since start",
                                    value=generated / max(time.time() - self._since, 1e-9))
        hits, queries = _number(stats.get("prefix_cache_hits")), _number(stats.get("prefix_cache_queries"))
        if hits is not None and queries is not None:
            yield GaugeMetricFamily("openclaw_prefix_cache_hit_ratio", "prompt tokens served by the "
                                    "prefix cache, of those looked up, since start",
                                    value=hits / max(queries, 1))
        for key, (name, help_text) in ENGINE_COUNTERS.items():
            if (value := _number(stats.get(key))) is not None:
                yield CounterMetricFamily(name, help_text, value=value)
        for key, (name, help_text) in ENGINE_HISTOGRAMS.items():
            if (buckets := _cumulative_buckets(stats.get(key))) is not None:
                yield HistogramMetricFamily(name, help_text, buckets=buckets,
                                            sum_value=float(stats[key]["sum"]))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _cumulative_buckets(histogram: Any) -> list[tuple[str, float]] | None:
    """The engine's histogram ({"buckets": upper bounds, "counts": per bucket with +Inf last,
    "sum", "count"}) as Prometheus' cumulative buckets; None when it is missing or malformed."""
    try:
        bounds = [float(b) for b in histogram["buckets"]]
        counts = [int(c) for c in histogram["counts"]]
        float(histogram["sum"])
    except (KeyError, TypeError, ValueError):
        return None
    if len(counts) != len(bounds) + 1 or bounds != sorted(bounds) or any(c < 0 for c in counts):
        return None
    buckets, total = [], 0
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        total += count
        buckets.append(("+Inf" if bound == math.inf else repr(bound), float(total)))
    return buckets


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
