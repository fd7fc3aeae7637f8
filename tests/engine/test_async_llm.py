"""AsyncLLM: many concurrent streams over one step loop; aborts free exactly their own blocks."""

from __future__ import annotations

import asyncio
import random

import pytest

from engine import LLM, AsyncLLM, SamplingParams
from tests.helpers.hf_reference import build_tiny_checkpoint

PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(build_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny")))


@pytest.fixture
async def engine(tiny_folder):
    llm = AsyncLLM(tiny_folder, kv_cache_gib=0.01, max_num_batched_tokens=128)
    yield llm
    llm.shutdown()


def prompts(n: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(1, 384) for _ in range(rng.randrange(3, 60))] for _ in range(n)]


async def collect(llm: AsyncLLM, prompt, rid: str):
    outs = [out async for out in llm.generate(prompt, PARAMS, rid)]
    return outs


async def test_sixteen_concurrent_streams_match_the_blocking_engine(engine, tiny_folder):
    batch = prompts(16)
    results = await asyncio.gather(*(collect(engine, p, f"r{i}") for i, p in enumerate(batch)))
    expected = LLM(tiny_folder, kv_cache_gib=0.01).generate(batch, PARAMS)
    for outs, exp in zip(results, expected, strict=True):
        assert [t for o in outs for t in o.delta_token_ids] == exp.token_ids  # deltas add up
        assert outs[-1].token_ids == exp.token_ids
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert engine.engine.block_manager.num_free_blocks == engine.engine.block_manager.num_blocks


async def test_abort_mid_stream_frees_its_blocks_and_leaves_the_others_intact(engine, tiny_folder):
    batch = prompts(8)
    victim_outs = []

    async def victim():
        async for out in engine.generate(batch[0], PARAMS, "victim"):
            victim_outs.append(out)
            if len(victim_outs) == 5:
                await engine.abort("victim")

    others = [collect(engine, p, f"o{i}") for i, p in enumerate(batch[1:])]
    results = await asyncio.gather(victim(), *others)
    assert victim_outs[-1].finish_reason == "abort"
    assert 5 <= len(victim_outs[-1].token_ids) < PARAMS.max_tokens
    expected = LLM(tiny_folder, kv_cache_gib=0.01).generate(batch[1:], PARAMS)
    for outs, exp in zip(results[1:], expected, strict=True):
        assert outs[-1].token_ids == exp.token_ids
        assert outs[-1].finish_reason == "length"
    bm = engine.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


async def test_leaving_the_stream_early_aborts_the_request(engine):
    async for _ in engine.generate(prompts(1)[0], PARAMS, "early"):
        break
    for _ in range(200):  # the abort travels through the command queue
        if not engine.engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert not engine.engine.has_unfinished_requests()
    bm = engine.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    for _ in range(200):  # what /status and /metrics read: no step ran after the abort
        if engine.stats()["num_running"] == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.stats()["num_running"] == 0 and engine.stats()["kv_usage"] == 0


async def test_a_bad_request_fails_alone(engine):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await collect(engine, [1, 2, 10_000], "bad")
    outs = await collect(engine, prompts(1)[0], "good")
    assert outs[-1].finish_reason == "length"


async def test_a_request_id_reused_after_leaving_early_streams_only_its_own_request(engine,
                                                                                  tiny_folder):
    # The first stream's abort is still queued when the same id is reused: the old request's
    # outputs and its "abort" must not reach the new stream.
    prompt = prompts(1)[0]
    first = engine.generate(prompt, PARAMS, "same")
    await anext(first)
    await first.aclose()  # what `break` does too, once the generator is collected
    outs = await collect(engine, prompt, "same")
    expected = LLM(tiny_folder, kv_cache_gib=0.01).generate([prompt], PARAMS)[0]
    assert [o.finish_reason for o in outs] == [None] * (len(outs) - 1) + ["length"]
    assert [t for o in outs for t in o.delta_token_ids] == expected.token_ids
    assert outs[-1].token_ids == expected.token_ids


async def test_a_cache_salt_keeps_prefix_hits_within_the_same_salt(engine):
    prompt = list(range(1, 70))  # four full blocks of 16, and a last token to run
    outs = {}
    for rid, salt in [("ann-1", "ann"), ("bob", "bob"), ("ann-2", "ann"), ("none", None)]:
        async for out in engine.generate(prompt, PARAMS, rid, cache_salt=salt):
            outs[rid] = out
    assert outs["ann-1"].num_cached_tokens == 0
    assert outs["bob"].num_cached_tokens == 0  # Ann's cached prompt is not Bob's to hit
    assert outs["ann-2"].num_cached_tokens == 64  # her own next prompt is
    assert outs["none"].num_cached_tokens == 0
    assert len({tuple(o.token_ids) for o in outs.values()}) == 1  # the same answer every time
