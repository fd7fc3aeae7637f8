"""/metrics as Prometheus reads it: every series parsed by the official client's parser, the
histograms' buckets cumulative and inclusive of their bounds, a gauge that fails left out."""

from __future__ import annotations

import asyncio
import math
import time

from prometheus_client.parser import text_string_to_metric_families

from openclaw.metrics import LOOP_LAG, Metrics, follow_loop_lag


def parsed(metrics: Metrics) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(metrics.render())}


def test_counters_summaries_histograms_and_gauges_parse_as_prometheus_text() -> None:
    m = Metrics()
    m.inc("openclaw_tool_calls_total", skill="shell", decision="allowed")
    m.inc("openclaw_tool_calls_total", skill='we"ird\nname', decision="denied")
    m.observe("openclaw_reloads_seconds", 0.5)
    m.histogram("openclaw_turn_seconds", (0.1, 1.0), help_text="a whole answer")
    for value in (0.05, 0.1, 0.7, 3.0):
        m.observe("openclaw_turn_seconds", value)
    m.gauge("openclaw_queue_length", lambda: 2, "waiting")
    m.gauge("openclaw_broken", lambda: 1 / 0)
    families = parsed(m)
    calls = {tuple(sorted(s.labels.items())): s.value
             for s in families["openclaw_tool_calls"].samples}
    assert calls == {(("decision", "allowed"), ("skill", "shell")): 1.0,
                     (("decision", "denied"), ("skill", 'we"ird\nname')): 1.0}
    turn = families["openclaw_turn_seconds"]
    assert turn.type == "histogram" and turn.documentation == "a whole answer"
    buckets = {s.labels["le"]: s.value for s in turn.samples if s.name.endswith("_bucket")}
    # Cumulative, and a value on a bound counts in it (le: less than or equal).
    assert buckets == {"0.1": 2.0, "1.0": 3.0, "+Inf": 4.0}
    sums = {s.name: s.value for s in turn.samples if not s.name.endswith("_bucket")}
    assert sums["openclaw_turn_seconds_count"] == 4 and math.isclose(
        sums["openclaw_turn_seconds_sum"], 3.85)
    assert families["openclaw_reloads_seconds"].type == "summary"
    assert families["openclaw_queue_length"].samples[0].value == 2
    assert "openclaw_broken" not in families  # left out; the scrape still works


def test_registering_a_histogram_again_keeps_what_it_holds() -> None:
    m = Metrics()
    m.histogram("openclaw_tool_seconds")
    m.observe("openclaw_tool_seconds", 2.0)
    m.histogram("openclaw_tool_seconds")  # a daemon's restart of its metrics set-up
    [count] = [s.value for s in parsed(m)["openclaw_tool_seconds"].samples
               if s.name == "openclaw_tool_seconds_count"]
    assert count == 1


async def test_the_event_loop_lag_histogram_shows_a_stall_every_chat_felt() -> None:
    m = Metrics()
    following = asyncio.create_task(follow_loop_lag(m, every_s=0.02))
    try:
        while LOOP_LAG not in m.histograms or sum(m.histograms[LOOP_LAG].counts) < 3:
            await asyncio.sleep(0.01)
        time.sleep(0.3)  # what a full collection of a big heap, or a blocking call, does
        seen = sum(m.histograms[LOOP_LAG].counts)
        while sum(m.histograms[LOOP_LAG].counts) < seen + 2:
            await asyncio.sleep(0.01)
    finally:
        following.cancel()
    [family] = [f for f in text_string_to_metric_families(m.render()) if f.name == LOOP_LAG]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    above = buckets["+Inf"] - buckets["0.25"]
    assert above >= 1  # the stall was seen, in the bucket of its size
