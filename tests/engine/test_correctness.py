"""The engine against transformers on the same weights: logits and greedy tokens, in every
batching situation the scheduler creates (batches, preemption, prefix hits, chunked prefill)."""

from __future__ import annotations

import random
import warnings

import pytest

from engine import LLM, SamplingParams
from tests.helpers.hf_reference import (
    build_tiny_checkpoint,
    compare_greedy,
    greedy,
    load_reference,
    prefill_logits,
)

FAMILIES = ["llama", "llama3-rope", "qwen2", "qwen3"]
STEPS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    folder = build_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    return folder, load_reference(folder)


def pool_gib(blocks: int, block_size: int = 16) -> float:
    """kv_cache_gib that gives the tiny model exactly `blocks` blocks (2 layers, 2 kv heads of 16)."""
    return blocks * block_size * 2 * 2 * 2 * 16 * 4 / 2**30


def prompts(n: int, lengths: list[int], seed: int = 0, prefix: list[int] | None = None):
    rng = random.Random(seed)
    return [(prefix or []) + [rng.randrange(1, 384) for _ in range(lengths[i % len(lengths)])]
            for i in range(n)]


def check_all(llm: LLM, ref_model, batch: list[list[int]]) -> None:
    outs = llm.generate(batch, GREEDY)
    for ids, out in zip(batch, outs, strict=True):
        note = compare_greedy(out.token_ids, greedy(ref_model, ids, STEPS))
        if note:
            warnings.warn(note, stacklevel=2)
        assert out.finish_reason == "length"


def test_prefill_logits_match_at_every_position(tiny):
    folder, ref = tiny
    llm = LLM(str(folder), kv_cache_gib=pool_gib(64))
    ids = prompts(1, [300])[0]
    ours = llm.engine.runner.prefill_logits(ids)
    theirs = prefill_logits(ref, ids)
    assert theirs.std() > 1.0, "reference logits are too flat to test anything"
    assert (ours - theirs).abs().max().item() < 2e-3


def test_single_request_greedy_matches(tiny):
    folder, ref = tiny
    check_all(LLM(str(folder), kv_cache_gib=pool_gib(64)), ref, prompts(1, [37]))


def test_eight_mixed_length_requests_batched_match(tiny):
    folder, ref = tiny
    llm = LLM(str(folder), kv_cache_gib=pool_gib(256))
    check_all(llm, ref, prompts(8, [1, 5, 16, 17, 33, 64, 120, 200], seed=1))


def test_preemption_under_a_tiny_pool_keeps_outputs(tiny):
    folder, ref = tiny
    # 12 blocks = 192 tokens; eight requests of 40 + 32 tokens need 40 blocks at once.
    llm = LLM(str(folder), kv_cache_gib=pool_gib(12), max_num_batched_tokens=64)
    check_all(llm, ref, prompts(8, [40], seed=2))
    assert llm.engine.stats()["num_preemptions"] > 0
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_shared_prefix_hits_the_cache_and_keeps_outputs(tiny):
    folder, ref = tiny
    llm = LLM(str(folder), kv_cache_gib=pool_gib(128))
    system = prompts(1, [100], seed=3)[0]
    batch = prompts(6, [3, 9, 20], seed=4, prefix=system)
    check_all(llm, ref, batch[:1])  # computes and caches the shared prefix
    hits_before = llm.engine.stats()["prefix_cache_hits"]
    check_all(llm, ref, batch[1:])
    hits = llm.engine.stats()["prefix_cache_hits"] - hits_before
    assert hits >= 5 * (100 // 16) * 16  # every later request reused the 6 full prefix blocks


def test_chunked_prefill_of_a_long_prompt_matches(tiny):
    folder, ref = tiny
    llm = LLM(str(folder), kv_cache_gib=pool_gib(128), max_num_batched_tokens=48)
    batch = prompts(3, [600, 7, 250], seed=5)
    check_all(llm, ref, batch)
