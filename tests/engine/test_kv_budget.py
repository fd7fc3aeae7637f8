"""The KV budget planner: what it computes from the config alone is the pool the engine allocates,
counted from the engine's own KV tensors and block manager, for models of different shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine import LLM
from engine.config import EngineConfig, ModelConfig
from engine.kv_budget import KVBudget, plan
from tests.helpers.hf_reference import build_tiny_checkpoint

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    # llama: 2 layers, 2 KV heads of 16; qwen3: 2 layers, 2 KV heads of 24 (heads x dim != hidden)
    return {kind: build_tiny_checkpoint(kind, tmp_path_factory.mktemp(kind)) for kind in ("llama", "qwen3")}


def model_config(folder: Path) -> ModelConfig:
    return ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))


def allocated(llm: LLM) -> tuple[int, int, int]:
    """(bytes, blocks, tokens) of the pool as the loaded engine holds it."""
    engine = llm.engine
    caches = engine.runner.kv_caches
    assert len(caches) == engine.model_config.num_layers
    blocks = {t.shape[1] for t in caches}
    assert blocks == {engine.block_manager.num_blocks}
    return (sum(t.numel() * t.element_size() for t in caches), engine.block_manager.num_blocks,
            engine.block_manager.num_blocks * engine.block_manager.block_size)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("settings", [dict(kv_cache_gib=0.003), dict(kv_cache_gib=0.0021, block_size=8),
                                      dict(kv_cache_gib=0.002, dtype="bfloat16")])
def test_the_plan_from_the_config_is_the_pool_the_engine_allocates(folders, kind, settings, device):
    config = EngineConfig(model=str(folders[kind]), device=device, max_model_len=256, **settings)
    budget = plan(model_config(folders[kind]), config, device)
    pool_bytes, blocks, tokens = allocated(LLM(config))
    assert (budget.pool_bytes, budget.num_blocks, budget.pool_tokens) == (pool_bytes, blocks, tokens)
    mc = model_config(folders[kind])
    width = 4 if device == "cpu" and "dtype" not in settings else 2
    assert budget.bytes_per_token == 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * width


def test_the_two_shapes_differ_and_the_cpu_default_pool_is_one_gib(folders):
    llama = plan(model_config(folders["llama"]), EngineConfig(device="cpu"), "cpu")
    qwen3 = plan(model_config(folders["qwen3"]), EngineConfig(device="cpu"), "cpu")
    assert (llama.bytes_per_token, qwen3.bytes_per_token) == (2 * 2 * 2 * 16 * 4, 2 * 2 * 2 * 24 * 4)
    for budget in (llama, qwen3):
        assert budget.pool_bytes <= 2**30 < budget.pool_bytes + budget.block_bytes


def test_the_engine_states_its_budget_in_its_stats(folders):
    llm = LLM(str(folders["qwen3"]), device="cpu", kv_cache_gib=0.003, max_model_len=256)
    stats = llm.engine.stats()
    budget = KVBudget.from_stats(stats)
    pool_bytes, blocks, tokens = allocated(llm)
    assert (budget.pool_bytes, budget.num_blocks, stats["kv_pool_tokens"]) == (pool_bytes, blocks, tokens)


def test_conversations_that_fit_and_when_the_batch_overcommits_the_pool():
    budget = KVBudget(bytes_per_token=1000, block_size=16, num_blocks=100)
    assert budget.conversations(160) == 10 and budget.conversations(161) == 9  # 11 blocks each
    assert not budget.overcommitted(max_num_seqs=10, context_tokens=160)
    assert budget.overcommitted(max_num_seqs=10, context_tokens=161)
    assert budget.gib_for(10, 161) == 10 * 11 * 16_000 / 2**30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a pool sized from GPU memory needs CUDA")
def test_a_pool_sized_from_gpu_memory_is_stated_as_allocated(folders):
    free, total = torch.cuda.mem_get_info()
    share = (total - free + 256 * 2**20) / total  # about 256 MiB beyond what is in use: a small pool
    llm = LLM(str(folders["llama"]), device="cuda", max_model_len=256, max_num_seqs=4,
              max_num_batched_tokens=256, gpu_memory_utilization=share, enforce_eager=True)
    budget = KVBudget.from_stats(llm.engine.stats())
    assert (budget.pool_bytes, budget.num_blocks, budget.pool_tokens) == allocated(llm)


def test_a_pool_sized_from_gpu_memory_is_not_known_before_the_load(folders):
    budget = plan(model_config(folders["llama"]), EngineConfig(device="cpu"), "cuda")
    assert budget.num_blocks is None and budget.conversations(100) is None
    assert not budget.overcommitted(64, 100_000)
    assert budget.bytes_per_token == 2 * 2 * 2 * 16 * 2  # bfloat16 on CUDA
    assert KVBudget.from_stats({"kv_usage": 0.5}) is None  # a server that does not say
