"""The CPU decode step on the native ops (LlamaForCausalLM's native decode path and the torch
backend's decode attention) against the torch path it replaces, and the switch back to it."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata
from engine.native import build, decode_ops
from tests.helpers.hf_reference import build_tiny_checkpoint

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler here")

STEPS = 24
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5)
# Odd lengths, block boundaries (block size 16) and a batch of sequences of different lengths.
PROMPTS = [[5 + i % 300 for i in range(n)] for n in (1, 15, 16, 17, 40, 97)]


@pytest.fixture(scope="module", params=["llama", "llama3-rope", "qwen2", "qwen3"])
def folder(request, tmp_path_factory):
    return str(build_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param)))


@pytest.fixture
def kernels(monkeypatch):
    """Sets OPENCLAW_CPU_KERNELS for the test (the ops are built once per process: caches cleared)."""
    def switch(on: bool) -> None:
        monkeypatch.setenv(build.DISABLE, "1" if on else "0")
        build.load.cache_clear()
        decode_ops.get.cache_clear()
    yield switch
    build.load.cache_clear()
    decode_ops.get.cache_clear()


def count_calls(monkeypatch) -> dict[str, int]:
    calls = dict.fromkeys(("add_rms_norm", "rope_kv_write", "decode_attention", "rope_write_attend",
                           "silu_and_mul"), 0)
    for name in calls:
        method = getattr(decode_ops.DecodeOps, name)

        def counted(self, *args, _name=name, _method=method, **kwargs):
            calls[_name] += 1
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(decode_ops.DecodeOps, name, counted)
    return calls


def run(folder: str):
    return LLM(folder, kv_cache_gib=0.01).generate(PROMPTS, PARAMS)


def test_decode_on_the_native_ops_gives_the_torch_paths_tokens_and_logprobs(folder, kernels,
                                                                              monkeypatch):
    kernels(False)
    reference = run(folder)
    kernels(True)
    calls = count_calls(monkeypatch)
    native = run(folder)
    # Every decode step's attention ran natively: Qwen3 (per-head q/k norm) keeps the module path
    # around it, the other families run the whole layer on the native ops.
    if "qwen3" in folder:
        assert calls["decode_attention"] >= STEPS - 1
    else:
        assert min(calls[k] for k in ("add_rms_norm", "rope_write_attend", "silu_and_mul")) >= STEPS - 1
    for ref, got in zip(reference, native, strict=True):
        assert got.token_ids == ref.token_ids
        for a, b in zip(ref.logprobs, got.logprobs, strict=True):
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
            assert [t for t, _ in b.top] == [t for t, _ in a.top]


def test_with_native_kernels_off_the_torch_path_runs(folder, kernels, monkeypatch):
    kernels(False)
    calls = count_calls(monkeypatch)
    outs = run(folder)
    assert decode_ops.get() is None
    assert sum(calls.values()) == 0
    assert all(len(o.token_ids) == STEPS for o in outs)


def test_without_a_compiler_the_torch_path_runs(folder, kernels, monkeypatch):
    monkeypatch.setenv("OPENCLAW_KERNEL_CACHE", "/nonexistent/empty-cache")  # nothing built there
    monkeypatch.setattr(build, "compiler", lambda: None)
    kernels(True)
    calls = count_calls(monkeypatch)
    outs = run(folder)
    assert sum(calls.values()) == 0
    assert all(len(o.token_ids) == STEPS for o in outs)


def test_a_step_reaching_past_the_pool_raises_instead_of_reading_stray_memory(folder, kernels):
    kernels(True)
    runner = LLM(folder, kv_cache_gib=0.01).engine.runner
    blocks = runner.kv_caches[0].shape[1]
    meta = AttentionMetadata(slot_mapping=torch.tensor([blocks * 16 + 3]),
                             block_tables=torch.tensor([[0, blocks]]), context_lens=torch.tensor([20]),
                             query_start=[0, 1], context_lens_host=[20], num_decodes=1)
    with pytest.raises((IndexError, RuntimeError)):
        runner.model(torch.tensor([7]), torch.tensor([19]), runner.kv_caches, meta, runner.backend)


def test_a_step_with_indices_outside_the_pool_is_left_to_the_torch_path(folder, kernels):
    from engine.native.decode_ops import fits_pool

    kernels(True)
    runner = LLM(folder, kv_cache_gib=0.01).engine.runner
    blocks, size = runner.kv_caches[0].shape[1], runner.kv_caches[0].shape[2]

    def meta(slot, table, ctx):
        return AttentionMetadata(slot_mapping=torch.tensor([slot]), block_tables=torch.tensor([table]),
                                 context_lens=torch.tensor([ctx]), query_start=[0, 1],
                                 context_lens_host=[ctx], num_decodes=1)

    assert fits_pool(meta(size + 3, [0, 1], 20), blocks, size)
    assert not fits_pool(meta(size + 3, [0, blocks], 20), blocks, size)  # a block past the pool
    assert not fits_pool(meta(size + 3, [-1, 1], 20), blocks, size)  # a negative block id
    assert not fits_pool(meta(-1, [0, 1], 20), blocks, size)  # a pad slot of -1
    assert not fits_pool(meta(blocks * size, [0, 1], 20), blocks, size)  # a slot past the pool
    assert not fits_pool(meta(size + 3, [0, 1], 2 * size + 1), blocks, size)  # past its table
