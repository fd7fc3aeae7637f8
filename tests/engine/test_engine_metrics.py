"""The engine's counters (LLMEngine.stats(), AsyncLLM.stats()) and each request's metrics: they
move as the work does, and agree with the block manager and the requests that finished."""

from __future__ import annotations

import random

import pytest

from engine import LLM, AsyncLLM, RequestMetrics, SamplingParams
from engine.engine_core import LLMEngine
from engine.stats import TPOT_BUCKETS, TTFT_BUCKETS, Histogram
from tests.helpers.hf_reference import build_tiny_checkpoint

NEW_KEYS = {"kv_blocks_used", "kv_blocks_cached", "prefix_cache_hit_tokens",
            "prefix_cache_query_tokens", "num_preemptions", "num_requests_finished",
            "ttft_seconds", "tpot_seconds"}
OLD_KEYS = {"model", "device", "num_running", "num_waiting", "kv_blocks", "kv_usage",
            "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generated_tokens"}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    return str(build_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny")))


def pool_gib(blocks: int) -> float:
    """kv_cache_gib for exactly `blocks` blocks of 16 of the tiny model."""
    return blocks * 16 * 2 * 2 * 2 * 16 * 4 / 2**30


def prompts(n: int, length: int, seed: int = 0, prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    return [(prefix or []) + [rng.randrange(1, 384) for _ in range(length)] for _ in range(n)]


def block_counts(engine: LLMEngine) -> tuple[int, int]:
    """(used, free-but-cached) blocks, counted from the block manager's own blocks."""
    blocks = engine.block_manager.blocks
    return (sum(b.ref_count > 0 for b in blocks),
            sum(b.ref_count == 0 and b.hash is not None for b in blocks))


def drain(engine: LLMEngine, check=None) -> dict[str, object]:
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        if check:
            check()
    return final


def test_stats_keep_the_old_keys_and_add_the_new(tiny_folder):
    stats = LLM(tiny_folder, kv_cache_gib=pool_gib(32)).engine.stats()
    assert OLD_KEYS | NEW_KEYS <= set(stats)
    for name, buckets in (("ttft_seconds", TTFT_BUCKETS), ("tpot_seconds", TPOT_BUCKETS)):
        hist = stats[name]
        assert hist["buckets"] == list(buckets) and hist["buckets"] == sorted(hist["buckets"])
        assert hist["counts"] == [0] * (len(buckets) + 1) and hist["sum"] == 0 and hist["count"] == 0


def test_blocks_used_and_cached_add_up_to_the_block_manager_after_every_step(tiny_folder):
    engine = LLM(tiny_folder, kv_cache_gib=pool_gib(40), max_num_batched_tokens=64).engine

    def check() -> None:
        stats = engine.stats()
        used, cached = block_counts(engine)
        assert (stats["kv_blocks_used"], stats["kv_blocks_cached"]) == (used, cached)
        assert used + engine.block_manager.num_free_blocks == stats["kv_blocks"]

    shared = prompts(1, 40, seed=1)[0]
    for i, prompt in enumerate(prompts(6, 20, seed=2, prefix=shared)):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=20,
                                                           ignore_eos=True))
    drain(engine, check)
    check()
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_cached"] > 0
    engine.block_manager.reset_prefix_cache()
    assert engine.stats()["kv_blocks_cached"] == 0 == block_counts(engine)[1]


def test_a_prefix_hit_counts_its_tokens(tiny_folder):
    engine = LLM(tiny_folder, kv_cache_gib=pool_gib(64)).engine
    system = prompts(1, 100, seed=3)[0]
    first, second = prompts(2, 10, seed=4, prefix=system)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.add_request("a", first, params)
    drain(engine)
    before = engine.stats()
    assert (before["prefix_cache_hit_tokens"], before["prefix_cache_query_tokens"]) == (0, 110)
    engine.add_request("b", second, params)
    final = drain(engine)
    after = engine.stats()
    hit = 100 // 16 * 16  # the six full blocks of the shared system prompt
    assert after["prefix_cache_hit_tokens"] == hit == final["b"].num_cached_tokens
    assert after["prefix_cache_query_tokens"] == 110 + 110
    # The old names count the same.
    assert (after["prefix_cache_hits"], after["prefix_cache_queries"]) == (hit, 220)


def test_a_preemption_counts(tiny_folder):
    engine = LLM(tiny_folder, kv_cache_gib=pool_gib(12), max_num_batched_tokens=64).engine
    for i, prompt in enumerate(prompts(8, 40, seed=5)):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=32,
                                                           ignore_eos=True))
    final = drain(engine)
    stats = engine.stats()
    assert stats["num_preemptions"] > 0
    assert stats["num_preemptions"] == engine.scheduler.num_preemptions
    assert stats["num_requests_finished"] == 8 == len(final)


def test_histogram_counts_equal_the_finished_requests(tiny_folder):
    engine = LLM(tiny_folder, kv_cache_gib=pool_gib(64)).engine
    lengths = [1, 2, 5, 9, 1, 16]
    for i, (prompt, n) in enumerate(zip(prompts(6, 12, seed=6), lengths, strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n,
                                                           ignore_eos=True))
    final = drain(engine)
    stats = engine.stats()
    ttft, tpot = stats["ttft_seconds"], stats["tpot_seconds"]
    assert stats["num_requests_finished"] == 6
    assert ttft["count"] == sum(ttft["counts"]) == 6  # every request made a first token
    assert tpot["count"] == sum(tpot["counts"]) == sum(n >= 2 for n in lengths)
    metrics = [final[f"r{i}"].metrics for i in range(6)]
    assert ttft["sum"] == pytest.approx(sum(m.first_token_time - m.arrival_time for m in metrics))
    assert tpot["sum"] == pytest.approx(sum(
        (m.finished_time - m.first_token_time) / (m.num_generation_tokens - 1)
        for m in metrics if m.num_generation_tokens >= 2))
    for m, n in zip(metrics, lengths, strict=True):
        assert m.arrival_time <= m.first_token_time <= m.finished_time
        assert m.num_generation_tokens == n


def test_request_metrics_move_as_the_request_does(tiny_folder):
    engine = LLM(tiny_folder, kv_cache_gib=pool_gib(32)).engine
    engine.add_request("r", prompts(1, 8)[0], SamplingParams(temperature=0.0, max_tokens=3,
                                                             ignore_eos=True))
    outs = [out for _ in range(3) for out in engine.step()]
    assert [o.metrics.num_generation_tokens for o in outs] == [1, 2, 3]
    assert len({o.metrics.first_token_time for o in outs}) == 1
    assert [o.metrics.finished_time is None for o in outs] == [True, True, False]
    # Each output keeps its own copy: later steps do not change what an earlier one said.
    assert outs[0].metrics is not outs[1].metrics


def test_an_abort_counts_as_finished_and_a_request_that_never_ran_has_no_first_token(tiny_folder):
    engine = LLM(tiny_folder, kv_cache_gib=pool_gib(32)).engine
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("ran", prompts(1, 8, seed=1)[0], params)
    engine.step()
    engine.step()
    engine.add_request("queued", prompts(1, 8, seed=2)[0], params)
    ran, queued = engine.abort_request("ran"), engine.abort_request("queued")
    assert ran.finish_reason == queued.finish_reason == "abort"
    assert ran.metrics.num_generation_tokens == 2 and ran.metrics.finished_time is not None
    assert queued.metrics.first_token_time is None and queued.metrics.finished_time is not None
    stats = engine.stats()
    assert stats["num_requests_finished"] == 2
    assert stats["ttft_seconds"]["count"] == 1 and stats["tpot_seconds"]["count"] == 1
    assert stats["kv_blocks_used"] == 0


def test_histogram_buckets_are_upper_bounds_and_the_last_is_inf():
    hist = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 3.0, 100.0):
        hist.observe(value)
    snap = hist.snapshot()
    assert snap == {"buckets": [0.1, 1.0], "counts": [2, 2, 2], "sum": pytest.approx(104.65),
                    "count": 6}
    snap["counts"][0] = 99  # a copy
    assert hist.counts == [2, 2, 2]


def test_request_metrics_default_to_now():
    metrics = RequestMetrics()
    assert metrics.arrival_time > 0 and metrics.first_token_time is None
    assert metrics.finished_time is None and metrics.num_generation_tokens == 0


async def test_async_stats_count_streams_from_their_arrival(tiny_folder):
    llm = AsyncLLM(tiny_folder, kv_cache_gib=pool_gib(64))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=1)
        finals = []
        for i, prompt in enumerate(prompts(3, 10, seed=8)):
            outs = [o async for o in llm.generate(prompt, params, f"a{i}")]
            assert [lp.token_id for o in outs for lp in o.delta_logprobs] == outs[-1].token_ids
            finals.append(outs[-1])
        stats = llm.stats()
        assert stats["num_requests_finished"] == 3 and stats["ttft_seconds"]["count"] == 3
        assert all(o.metrics.arrival_time < o.metrics.first_token_time for o in finals)
        stats["ttft_seconds"]["counts"][0] = 99  # the caller's own copy
        assert llm.stats()["ttft_seconds"]["counts"][0] != 99
    finally:
        llm.shutdown()
