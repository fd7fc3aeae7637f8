"""/metrics as Prometheus reads it: every series parsed by the official client's parser, the
histograms' buckets cumulative and inclusive of their bounds, a gauge that fails left out, and the
engine's own numbers read from its stats() at scrape time."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from openclaw.metrics import LOOP_LAG, Metrics, engine_metrics, follow_loop_lag


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
        while m.value(LOOP_LAG + "_count") < 3:
            await asyncio.sleep(0.01)
        time.sleep(0.3)  # what a full collection of a big heap, or a blocking call, does
        seen = m.value(LOOP_LAG + "_count")
        while m.value(LOOP_LAG + "_count") < seen + 2:
            await asyncio.sleep(0.01)
    finally:
        following.cancel()
    [family] = [f for f in text_string_to_metric_families(m.render()) if f.name == LOOP_LAG]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    above = buckets["+Inf"] - buckets["0.25"]
    assert above >= 1  # the stall was seen, in the bucket of its size


def test_each_metrics_has_a_registry_of_its_own_and_never_the_global_one() -> None:
    from prometheus_client import REGISTRY

    first, second = Metrics(), Metrics()
    first.inc("openclaw_turns_total", result="answered")
    assert first.value("openclaw_turns_total", result="answered") == 1
    assert second.value("openclaw_turns_total", result="answered") == 0
    assert REGISTRY.get_sample_value("openclaw_turns_total", {"result": "answered"}) is None
    assert "_created" not in first.render()  # no OpenMetrics-only timestamps in the text format


def test_a_counter_keeps_the_label_names_it_was_first_used_with() -> None:
    m = Metrics()
    m.inc("openclaw_turns_total", result="answered")
    with pytest.raises(ValueError):
        m.inc("openclaw_turns_total", outcome="answered")
    assert m.counter_series() == 1


# What the engine's stats() says, in the shape docs/engine.md gives (DESIGN21): per-bucket counts
# with +Inf last, cumulative token counts, and today's keys.
ENGINE_STATS = {
    "model": "tiny", "device": "cpu", "num_running": 3, "num_waiting": 2, "kv_blocks": 100,
    "kv_usage": 0.25, "kv_blocks_used": 25, "kv_blocks_cached": 40, "prefix_cache_queries": 400,
    "prefix_cache_hits": 100, "prefix_cache_hit_tokens": 96, "prefix_cache_query_tokens": 400,
    "num_preemptions": 1, "num_requests_finished": 7, "prompt_tokens": 500, "generated_tokens": 60,
    "ttft_seconds": {"buckets": [0.01, 0.1, 1.0], "counts": [2, 3, 1, 1], "sum": 4.2, "count": 7},
    "tpot_seconds": {"buckets": [0.01, 0.1], "counts": [5, 1, 0], "sum": 0.09, "count": 6},
}


def engine_families(stats) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(engine_metrics(lambda: stats).render())}


def test_the_engine_collector_exports_every_key_of_the_engines_stats() -> None:
    families = engine_families(ENGINE_STATS)
    single = {name: (f.type, f.samples[0].value) for name, f in families.items()
              if f.type in ("gauge", "counter") and name != "openclaw_tokens_per_second"}
    assert single == {
        "openclaw_engine_running": ("gauge", 3), "openclaw_engine_waiting": ("gauge", 2),
        "openclaw_kv_cache_usage": ("gauge", 0.25), "openclaw_engine_kv_blocks": ("gauge", 100),
        "openclaw_engine_kv_blocks_used": ("gauge", 25), "openclaw_engine_kv_blocks_cached": ("gauge", 40),
        "openclaw_generated_tokens": ("gauge", 60), "openclaw_prefix_cache_hit_ratio": ("gauge", 0.25),
        "openclaw_engine_prefix_cache_hit_tokens": ("counter", 96),
        "openclaw_engine_prefix_cache_query_tokens": ("counter", 400),
        "openclaw_engine_preemptions": ("counter", 1),
        "openclaw_engine_requests_finished": ("counter", 7)}
    assert families["openclaw_tokens_per_second"].samples[0].value > 0
    ttft = families["openclaw_engine_time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in ttft.samples}
    assert samples == {  # cumulative, as Prometheus reads buckets
        ("openclaw_engine_time_to_first_token_seconds_bucket", "0.01"): 2,
        ("openclaw_engine_time_to_first_token_seconds_bucket", "0.1"): 5,
        ("openclaw_engine_time_to_first_token_seconds_bucket", "1.0"): 6,
        ("openclaw_engine_time_to_first_token_seconds_bucket", "+Inf"): 7,
        ("openclaw_engine_time_to_first_token_seconds_count", None): 7,
        ("openclaw_engine_time_to_first_token_seconds_sum", None): 4.2}
    tpot = families["openclaw_engine_time_per_output_token_seconds"]
    assert [s.value for s in tpot.samples if s.name.endswith("_count")] == [6]


def test_the_engine_collector_reads_stats_at_scrape_time_once() -> None:
    calls, stats = [], dict(ENGINE_STATS)

    def read():
        calls.append(1)
        return stats

    metrics = engine_metrics(read)
    assert calls == []  # registering reads nothing
    stats["num_running"] = 9
    assert "openclaw_engine_running 9.0" in metrics.render() and len(calls) == 1


def test_keys_the_engine_does_not_report_are_simply_not_exported() -> None:
    # Today's engine (no histograms, no block or request counts), a remote backend's few numbers,
    # a malformed histogram, a value that is no number: each left out, the rest exported.
    families = engine_families({"num_running": 1, "kv_usage": 0.5, "num_waiting": None,
                                "model": "x", "ttft_seconds": {"buckets": [1.0], "counts": [1]}})
    assert sorted(families) == ["openclaw_engine_running", "openclaw_kv_cache_usage"]


def test_an_engine_whose_stats_fail_leaves_the_rest_of_the_scrape_intact() -> None:
    m = Metrics()
    m.inc("openclaw_turns_total", result="answered")

    def broken():
        raise RuntimeError("the engine died")

    m.add_engine(broken)
    assert sorted(parsed(m)) == ["openclaw_turns"]


@pytest.mark.slow
def test_the_engine_collector_reads_todays_real_engine(tmp_path) -> None:
    from engine import LLM, SamplingParams
    from tests.helpers.hf_reference import build_tiny_checkpoint

    llm = LLM(str(build_tiny_checkpoint("llama", tmp_path)), kv_cache_gib=0.01)
    llm.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    stats = llm.engine.stats()
    families = engine_families(stats)
    assert families["openclaw_generated_tokens"].samples[0].value == stats["generated_tokens"] > 0
    assert families["openclaw_engine_running"].samples[0].value == 0
    assert "openclaw_engine_preemptions" in families  # num_preemptions is there today
    exported = {key for key in ("ttft_seconds", "tpot_seconds", "kv_blocks_used", "kv_blocks_cached",
                                "prefix_cache_hit_tokens", "num_requests_finished") if key in stats}
    named = {"ttft_seconds": "openclaw_engine_time_to_first_token_seconds",
             "tpot_seconds": "openclaw_engine_time_per_output_token_seconds",
             "kv_blocks_used": "openclaw_engine_kv_blocks_used",
             "kv_blocks_cached": "openclaw_engine_kv_blocks_cached",
             "prefix_cache_hit_tokens": "openclaw_engine_prefix_cache_hit_tokens",
             "num_requests_finished": "openclaw_engine_requests_finished"}
    # Whichever of the new keys this engine reports is exported, and no other.
    assert {key for key, name in named.items() if name in families} == exported
