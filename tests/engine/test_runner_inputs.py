"""The CUDA path's host-side logic, checked on the CPU: the decode-graph ladder, padded decode
inputs (what CUDA graphs replay over), decode steps through the graphs' static buffers with the
capture replaced by a plain call (Triton attention under the interpreter), and the sampler's
device path (run on CPU tensors, against the CPU path's semantics). The last tests need CUDA:
real graphs against eager steps, and a sampler that never synchronises."""

from __future__ import annotations

import functools
import math
import os

import torch

if not torch.cuda.is_available():  # before triton's first import: see test_triton_kernels.py
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from engine.model_runner import DecodeGraphs, fill_decode_inputs, graph_batch_sizes, padded_batch_size
from engine.sampler import (
    Sampler,
    apply_top_k_top_p,
    make_generator,
    sample_on_device,
    top_k_top_p_by_sort,
)
from engine.sampling_params import SamplingParams

# ---- the graph ladder ---------------------------------------------------------------------------


def test_graph_sizes_double_to_eight_then_step_by_eight_up_to_max_num_seqs():
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(100)[-3:] == [88, 96, 100]  # max_num_seqs itself is always captured
    assert graph_batch_sizes(4096)[-1] == 512  # capped


def test_a_step_replays_the_smallest_graph_that_fits():
    sizes = graph_batch_sizes(64)
    assert [padded_batch_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16, 17, 63, 64)] == \
        [1, 2, 4, 8, 8, 16, 16, 24, 64, 64]


# ---- padded decode inputs -----------------------------------------------------------------------


def stale_buffers(max_bs: int = 8, max_blocks: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers holding a previous step's leftovers (7s), as the pinned staging buffers would."""
    return torch.full((4 * max_bs,), 7, dtype=torch.int64), torch.full((max_bs * max_blocks,), 7,
                                                                       dtype=torch.int64)


def test_padded_decode_inputs_lay_out_real_rows_then_padding_rows():
    vec_buf, table_buf = stale_buffers()
    vectors, tables = fill_decode_inputs(
        vec_buf, table_buf,
        input_ids=[11, 12, 13], positions=[40, 3, 17], slots=[5 * 16 + 8, 2 * 16 + 3, 9 * 16 + 1],
        context_lens=[41, 4, 18], tables=[[0, 1, 5], [2], [4, 9]], padded=4)
    assert vectors.tolist() == [
        [11, 12, 13, 0],  # input ids: padding is token 0
        [40, 3, 17, 0],  # positions: padding at 0 (a valid row of the rope table)
        [88, 35, 145, -1],  # slots: -1, so the attention kernels write no KV for padding
        [41, 4, 18, 0],  # context lens: 0, so they read none and output zeros
    ]
    assert tables.tolist() == [[0, 1, 5], [2, 0, 0], [4, 9, 0], [0, 0, 0]]


def test_padded_decode_inputs_are_contiguous_views_of_the_staging_buffers():
    # Contiguous, so the copy to the device goes straight from pinned memory (a strided source
    # would be copied to pageable memory first, and that copy would wait for the GPU).
    vec_buf, table_buf = stale_buffers()
    vectors, tables = fill_decode_inputs(vec_buf, table_buf, [1], [0], [0], [1], [[3, 4]], padded=2)
    assert vectors.is_contiguous() and tables.is_contiguous()
    assert vectors.data_ptr() == vec_buf.data_ptr() and tables.data_ptr() == table_buf.data_ptr()
    assert tables.shape == (2, 2)  # width: the longest table this step, not max_blocks


def test_a_smaller_step_after_a_larger_one_leaves_no_stale_values_in_its_rows():
    vec_buf, table_buf = stale_buffers()
    fill_decode_inputs(vec_buf, table_buf, [1] * 8, [9] * 8, [9] * 8, [10] * 8, [[1, 2, 3]] * 8, padded=8)
    vectors, tables = fill_decode_inputs(vec_buf, table_buf, [5], [2], [2], [3], [[6]], padded=2)
    assert vectors.tolist() == [[5, 0], [2, 0], [2, -1], [3, 0]]
    assert tables.tolist() == [[6], [0]]


# ---- decode steps through the static buffers, on the CPU ----------------------------------------


class ReplayedByCalling(DecodeGraphs):
    """DecodeGraphs whose "replay" calls the model again on the same static-buffer views: the same
    padding, metadata and buffer traffic as on CUDA, without a capture."""

    @torch.inference_mode()
    def _capture(self, model, kv_caches, backend, device) -> None:
        for bs in reversed(self.sizes):
            args = self._step_args(bs, kv_caches, backend)
            self._outputs[bs] = model(*args)
            self._replays[bs] = functools.partial(self._call, bs, model, args)
        self.calls: list[int] = []

    def _call(self, bs: int, model, args) -> None:
        self.calls.append(bs)
        self._outputs[bs].copy_(model(*args))


def test_decode_steps_over_padded_static_buffers_match_eager_steps(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from engine import LLM
    from engine.attention import TritonAttentionBackend
    from tests.helpers.hf_reference import build_tiny_checkpoint

    monkeypatch.setenv("OPENCLAW_ATTENTION", "triton")  # padding rows need the Triton kernels
    folder = build_tiny_checkpoint("qwen3", tmp_path / "qwen3")
    prompts = [[(5 * i + j) % 380 + 1 for j in range(4 + 13 * i)] for i in range(3)]  # 3 rows: padded to 4
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outs = []
    for graphs in (False, True):
        llm = LLM(str(folder), kv_cache_gib=0.002, max_num_seqs=4, max_model_len=96)
        runner = llm.engine.runner
        assert isinstance(runner.backend, TritonAttentionBackend)
        if graphs:
            runner.graphs = ReplayedByCalling(runner.model, runner.kv_caches, runner.backend,
                                              graph_batch_sizes(4), math.ceil(96 / runner.block_size),
                                              runner.device)
        outs.append([o.token_ids for o in llm.generate(prompts, greedy)])
    assert runner.graphs.calls == [4, 4, 4]  # three decode steps, 3 rows each, at the padded size 4
    assert outs[1] == outs[0]


def test_the_largest_step_used_to_size_the_gpu_pool_runs(tmp_path):
    # On CUDA its memory peak sizes the KV pool; here it must at least run, prompts cut to
    # max_model_len and logits for max_num_seqs rows.
    from engine import LLM
    from tests.helpers.hf_reference import build_tiny_checkpoint

    folder = build_tiny_checkpoint("llama", tmp_path / "llama")
    llm = LLM(str(folder), kv_cache_gib=0.002, max_num_seqs=6, max_num_batched_tokens=100, max_model_len=40)
    tokens = llm.engine.runner.run_largest_step()
    assert tokens.shape == (6,) and int(tokens.max()) < 384


# ---- the sampler's device path, on CPU tensors --------------------------------------------------


def random_logits(batch: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen) * 3
    logits[:, 5] = logits[:, 6]  # a tie, which top-k and top-p must keep together
    return logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sort_based_top_k_top_p_keeps_exactly_what_the_cpu_path_keeps(seed):
    logits = random_logits(6, 300, seed)
    top_k = torch.tensor([0, 5, 0, 40, 1, 300])
    top_p = torch.tensor([0.9, 1.0, 0.3, 0.8, 0.5, 0.999])
    want = apply_top_k_top_p(logits, top_k, top_p)
    got = top_k_top_p_by_sort(logits, top_k, top_p)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert torch.equal(got[torch.isfinite(got)], logits[torch.isfinite(want)])
    kept = torch.isfinite(want).sum(dim=-1).tolist()
    assert len(set(kept)) >= 4 and kept[4] == 1  # the masks differ from row to row


def test_device_path_greedy_rows_are_argmax_and_other_rows_sample():
    logits = random_logits(8, 500, 3)
    params = [SamplingParams(temperature=0.0, top_p=0.5) if i % 2 == 0
              else SamplingParams(temperature=5.0, top_k=100, min_p=0.01) for i in range(8)]
    torch.manual_seed(0)
    tokens = sample_on_device(logits, params, [None] * 8, [[]] * 8, [[]] * 8)
    assert tokens.shape == (8,) and tokens.dtype == torch.int64
    assert torch.equal(tokens[0::2], logits[0::2].argmax(dim=-1))
    assert not torch.equal(tokens[1::2], logits[1::2].argmax(dim=-1))


def test_device_path_never_samples_a_masked_token():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(4000, -1)
    torch.manual_seed(1)
    params = [SamplingParams(temperature=1.0, top_p=0.8)] * 4000
    draws = sample_on_device(probs, params, [None] * 4000, [[]] * 4000, [[]] * 4000)
    assert set(draws.tolist()) == {0, 1}
    # and both survivors come up in about their renormalised proportions (0.625 / 0.375)
    assert 0.58 < draws.eq(0).float().mean().item() < 0.67


def test_device_path_seeded_row_ignores_its_batch_mates():
    logits = random_logits(4, 200, 4)
    tracked = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=42)

    def draw(params: list[SamplingParams], rows: torch.Tensor) -> list[int]:
        gens = [make_generator(p.seed, torch.device("cpu")) for p in params]
        out = []
        for _ in range(20):
            out.append(sample_on_device(rows, params, gens, [[]] * len(params), [[]] * len(params)))
        return [int(t[-1]) for t in out]

    alone = draw([tracked], logits[3:])
    mates = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0), SamplingParams(seed=7)]
    assert draw([*mates, tracked], logits) == alone
    assert len(set(alone)) > 3


def test_device_path_penalties_equal_the_cpu_path_and_touch_only_their_rows():
    logits = random_logits(3, 50, 5)
    top = logits.amax(dim=-1)
    # Each row's favourite is a token it has already produced, by a small margin.
    logits[0, 3], logits[1, 8], logits[2, 10] = top[0] + 0.1, top[1] + 0.1, top[2] + 0.5
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5),
              SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, presence_penalty=2.0)]
    prompts, outputs = [[1, 2, 3], [4, 5], [6]], [[3, 3, 7], [8, 9], [10, 10]]
    got = sample_on_device(logits, params, [None] * 3, prompts, outputs)
    assert torch.equal(got, Sampler()(logits, params, [None] * 3, prompts, outputs))
    assert got[0] != 3 and got[2] != 10  # penalised away
    assert got[1] == 8  # no penalties asked: untouched


# ---- CUDA only ----------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_device_sampler_never_waits_for_the_gpu():
    logits = random_logits(16, 1000, 6).cuda()
    params = [SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=i if i % 4 == 0 else None,
                             presence_penalty=0.3 if i % 3 == 0 else 0.0) for i in range(16)]
    params[1] = SamplingParams(temperature=0.0)
    gens = [make_generator(p.seed, torch.device("cuda")) for p in params]
    sampler = Sampler()
    sampler(logits, params, gens, [[1, 2]] * 16, [[3]] * 16)  # warm the pinned-memory cache
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sampler(logits, params, gens, [[1, 2]] * 16, [[3]] * 16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.is_cuda and tokens.shape == (16,)


@cuda
def test_a_replayed_decode_graph_computes_what_an_eager_step_computes(tmp_path):
    from engine import LLM
    from tests.helpers.hf_reference import build_tiny_checkpoint

    folder = build_tiny_checkpoint("qwen3", tmp_path / "qwen3")
    llm = LLM(str(folder), dtype="float32", kv_cache_gib=0.05, max_num_seqs=16)
    engine, runner = llm.engine, llm.engine.runner
    assert runner.graphs is not None, "CUDA graphs should be on by default on CUDA"
    prompts = [[(7 * i + j) % 380 + 1 for j in range(5 + 9 * i)] for i in range(11)]  # 11: padded to 16
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.step()  # every prefill fits one step's budget
    batch = engine.scheduler.schedule()
    assert batch.num_new_tokens == [1] * 11
    with torch.inference_mode():  # as execute() runs it
        graphed = runner._forward(batch)[0].clone()
        graphs, runner.graphs = runner.graphs, None
        eager = runner._forward(batch)[0]  # same slots: rewrites the same K/V
    runner.graphs = graphs
    torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-4)
    assert eager.abs().max() > 0.1  # real rows, not padding zeros


@cuda
def test_generation_with_decode_graphs_finishes_every_request(tmp_path):
    from engine import LLM
    from tests.helpers.hf_reference import build_tiny_checkpoint

    folder = build_tiny_checkpoint("llama", tmp_path / "llama")
    llm = LLM(str(folder), kv_cache_gib=0.05, max_num_seqs=8)  # bfloat16 by default on CUDA
    prompts = [[(3 * i + j) % 380 + 1 for j in range(3 + 11 * i)] for i in range(13)]  # > max_num_seqs
    outs = llm.generate(prompts, SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=3))
    assert [len(o.token_ids) for o in outs] == [20] * 13
    assert all(0 <= t < 384 for o in outs for t in o.token_ids)


@cuda
def test_a_decode_step_does_not_overwrite_the_staging_buffers_of_a_copy_still_queued(tmp_path):
    # The pinned staging buffers are reused every step. Without a sampled-token read in between
    # (a step that samples nothing), the next step's fill must wait for the previous step's
    # non-blocking copies, or the GPU would copy the next step's inputs for the previous step.
    from engine import LLM
    from tests.helpers.hf_reference import build_tiny_checkpoint

    folder = build_tiny_checkpoint("llama", tmp_path / "llama")
    llm = LLM(str(folder), dtype="float32", kv_cache_gib=0.05, max_num_seqs=4)
    graphs = llm.engine.runner.graphs
    assert graphs is not None

    def step(token: int) -> torch.Tensor:  # padding-like rows: no KV read or written, output per token
        return graphs.run([token], [0], [-1], [0], [[0]])

    with torch.inference_mode():
        want = step(5).clone()
        torch.cuda.synchronize()
        torch.cuda._sleep(500_000_000)  # keep the GPU busy so that the next copies stay queued
        got = step(5).clone()
        step(9)
        torch.cuda.synchronize()
        other = step(9).clone()
    assert not torch.equal(want, other)  # the two inputs give different outputs
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@cuda
def test_an_eager_prefill_step_never_waits_for_the_gpu(tmp_path):
    from engine import LLM
    from tests.helpers.hf_reference import build_tiny_checkpoint

    folder = build_tiny_checkpoint("qwen3", tmp_path / "qwen3")
    llm = LLM(str(folder), kv_cache_gib=0.05, max_num_seqs=4)
    engine, runner = llm.engine, llm.engine.runner
    for i in range(3):
        engine.add_request(f"r{i}", [(5 * i + j) % 380 + 1 for j in range(7 + 9 * i)],
                           SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    batch = engine.scheduler.schedule()
    assert any(n > 1 for n in batch.num_new_tokens)
    with torch.inference_mode():
        runner._forward(batch)  # compiles the kernels and warms the pinned-memory cache
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            hidden = runner._forward(batch)[0]  # rewrites the same K/V
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert hidden.is_cuda and hidden.shape[0] == sum(batch.num_new_tokens)
