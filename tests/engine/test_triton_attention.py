"""The Triton attention backend against the torch reference: natively on CUDA when there is one
(fp32, fp16, bf16), otherwise on CPU tensors under TRITON_INTERPRET=1 (fp32, fp16: the interpreter's
bf16 tl.dot is wrong).

Ragged contexts, block tables in random physical order, lengths off the block size, GQA and MHA,
decodes split across several partitions, prefill with and without a cached prefix, mixed batches,
padding slots (-1) and padding rows (context 0) as CUDA graphs produce them. Tiles are shrunk so tiny
shapes still run every loop.

TRITON_INTERPRET: triton (3.x, checked on 3.9) reads it through triton.knobs when `triton.jit` wraps
a function. Our kernels are wrapped when engine.kernels.attention is first imported (only by the
backend's first forward), but triton's own helpers (tl.max, tl.sum, tl.cdiv) are wrapped when triton
itself is imported, and natively wrapped helpers cannot run in the interpreter. So on a machine
without CUDA the variable is set here, before triton is imported; the engine never imports triton
there, and test_triton_kernels.py sets it the same way. On CUDA it is left alone.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from engine.attention import (  # noqa: E402
    AttentionMetadata,
    TorchAttentionBackend,
    TritonAttentionBackend,
    get_backend,
)

triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'openclaw-py[gpu]')")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


def _kernels() -> ModuleType:
    import engine.kernels.attention

    return engine.kernels.attention


@pytest.fixture(scope="module", autouse=True)
def interpreted_helpers() -> None:
    if DEVICE.type == "cpu":
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(triton.language.standard.max, InterpretedFunction):
            pytest.fail("triton was imported before TRITON_INTERPRET=1 was set, so its own helpers "
                        "(tl.max) cannot run in the interpreter: set TRITON_INTERPRET=1 in every test "
                        "module that imports triton on a CPU-only machine, before the import")
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set on a CUDA machine: these would test the interpreter, not "
                    "the compiled kernels; run this file without it")


TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@dataclass
class Step:
    """One forward's inputs: the flat batch, the pool and the metadata (host lists kept for rebuilding)."""

    seqs: list[tuple[int, int]]  # (context incl. new tokens, new tokens); context 0 = padding row
    tables: list[list[int]]
    num_decodes: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_size: int
    table_width: int

    def meta(self, keep: list[int] | None = None) -> AttentionMetadata:
        keep = list(range(len(self.seqs))) if keep is None else keep
        bs = self.block_size
        slots, query_start, lens = [], [0], []
        for s in keep:
            ctx, new = self.seqs[s]
            table = self.tables[s]
            slots += [table[p // bs] * bs + p % bs for p in range(ctx - new, ctx)] if ctx else [-1]
            query_start.append(query_start[-1] + new)
            lens.append(ctx)
        rows = [self.tables[s] + [0] * (self.table_width - len(self.tables[s])) for s in keep]
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            block_tables=torch.tensor(rows, dtype=torch.int64, device=DEVICE),
            context_lens=torch.tensor(lens, dtype=torch.int64, device=DEVICE),
            query_start=query_start, context_lens_host=lens,
            num_decodes=sum(1 for s in keep if s < self.num_decodes))

    def token_rows(self, keep: list[int]) -> list[int]:
        starts = [0]
        for _, new in self.seqs:
            starts.append(starts[-1] + new)
        return [i for s in keep for i in range(starts[s], starts[s + 1])]


def make_step(seqs: list[tuple[int, int]], num_decodes: int, heads: int, kv_heads: int, head_dim: int,
              block_size: int, dtype: torch.dtype, seed: int = 0, table_width: int | None = None) -> Step:
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same values on every device
    # Every sequence (a padding row too) owns its blocks; physical blocks handed out in random order.
    counts = [max(1, math.ceil(ctx / block_size)) for ctx, _ in seqs]
    num_blocks = sum(counts) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, cursor = [], 0
    for n in counts:
        tables.append(perm[cursor:cursor + n])
        cursor += n
    num_tokens = sum(new for _, new in seqs)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)

    # k and v as strided views of one fused projection, the way the model hands them over.
    qkv = randn(num_tokens, (heads + 2 * kv_heads) * head_dim)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    pool = (num_blocks, block_size, kv_heads, head_dim)
    return Step(seqs, tables, num_decodes, q.reshape(num_tokens, heads, head_dim),
                k.view(num_tokens, kv_heads, head_dim), v.view(num_tokens, kv_heads, head_dim),
                randn(*pool), randn(*pool), block_size, table_width or max(counts))


def run_both(step: Step, backend: TritonAttentionBackend) -> None:
    """Triton on the step's dtype against the torch reference in fp32 on the same values: outputs,
    and the pools after the KV write. Padding rows must come out as zeros."""
    got_k, got_v = step.k_cache.clone(), step.v_cache.clone()
    got = backend.forward(step.q, step.k, step.v, got_k, got_v, step.meta(), step.q.shape[-1] ** -0.5)

    # The reference cannot take slot -1 or context 0: it runs without the padding rows.
    keep = [s for s, (ctx, _) in enumerate(step.seqs) if ctx > 0]
    rows = step.token_rows(keep)
    want_k, want_v = step.k_cache.float(), step.v_cache.float()
    want = TorchAttentionBackend().forward(step.q[rows].float(), step.k[rows].float(), step.v[rows].float(),
                                           want_k, want_v, step.meta(keep), step.q.shape[-1] ** -0.5)
    assert torch.equal(got_k.float(), want_k) and torch.equal(got_v.float(), want_v), "pool after KV write"
    err = (got[rows].float() - want).abs().max().item()
    assert err <= TOL[step.q.dtype], f"max abs error {err}"
    padding = [r for r in range(got.shape[0]) if r not in set(rows)]
    assert torch.equal(got[padding], torch.zeros_like(got[padding])), "padding rows must be zeros"


# (query heads, KV heads, head_dim): GQA 4:1 on a power-of-two head_dim; MHA on 24 (padded to 32)
SHAPES = [(8, 2, 32), (3, 3, 24)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kv_write_stores_every_token_at_its_slot_and_skips_padding_slots(dtype):
    step = make_step([(0, 1), (11, 11), (0, 1), (5, 2)], 0, 4, 2, 32, 8, dtype)
    meta = step.meta()
    assert (meta.slot_mapping == -1).sum() == 2
    got_k, got_v = step.k_cache.clone(), step.v_cache.clone()
    _kernels().store_kv(step.k, step.v, got_k, got_v, meta.slot_mapping)
    real = meta.slot_mapping >= 0
    want_k, want_v = step.k_cache.clone(), step.v_cache.clone()
    want_k.view(-1, 2, 32)[meta.slot_mapping[real]] = step.k[real]
    want_v.view(-1, 2, 32)[meta.slot_mapping[real]] = step.v[real]
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("shape", SHAPES, ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_splits_a_long_context_and_reduces_by_log_sum_exp(dtype, shape):
    heads, kv_heads, head_dim = shape
    # 45 tokens over 16-token partitions: three splits, the last partly filled; 1 token; 8 = one block.
    step = make_step([(45, 1), (1, 1), (20, 1), (8, 1)], 4, heads, kv_heads, head_dim, 8, dtype, seed=1)
    run_both(step, TritonAttentionBackend(decode_partition=16, decode_block_n=16))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_in_one_partition_writes_the_output_without_a_reduce(dtype):
    step = make_step([(37, 1), (1, 1), (16, 1)], 3, 8, 2, 32, 16, dtype, seed=2)
    run_both(step, TritonAttentionBackend())  # default tiles: the 48-token table is one partition


@pytest.mark.parametrize("partition", [None, 16], ids=["one-partition", "split"])
def test_decode_padding_rows_give_zeros_and_wide_tables_change_nothing(partition):
    # A CUDA-graph batch: padding rows (context 0, slot -1) and a table as wide as max_model_len.
    step = make_step([(30, 1), (0, 1), (3, 1), (0, 1)], 4, 8, 2, 32, 8, torch.float32, seed=3, table_width=12)
    run_both(step, TritonAttentionBackend(decode_partition=partition, decode_block_n=16))
    # Written, not left as they were: an output buffer full of NaN must come back finite.
    out = torch.full_like(step.q, float("nan"))
    meta = step.meta()
    _kernels().decode_attention(step.q, step.k_cache, step.v_cache, meta.block_tables, meta.context_lens,
                                0.2, out, partition, 16)
    assert torch.equal(out[[1, 3]], torch.zeros_like(out[[1, 3]])) and not out.isnan().any()


def test_decode_reads_no_host_lists():
    """The decode path must replay inside a CUDA graph: device tensors and shapes only."""
    step = make_step([(21, 1), (4, 1)], 2, 8, 2, 32, 8, torch.float32, seed=4)
    backend = TritonAttentionBackend(decode_partition=16, decode_block_n=16)
    meta = step.meta()
    want = backend.forward(step.q, step.k, step.v, step.k_cache.clone(), step.v_cache.clone(), meta, 0.2)
    meta.query_start, meta.context_lens_host = [], []  # a step captured once, replayed with new tensors
    got = backend.forward(step.q, step.k, step.v, step.k_cache.clone(), step.v_cache.clone(), meta, 0.2)
    assert torch.equal(got, want)


@pytest.mark.parametrize("shape", SHAPES, ids=["gqa", "mha"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_chunks_with_and_without_a_cached_prefix(dtype, shape):
    heads, kv_heads, head_dim = shape
    # A fresh prompt of 19; 11 new tokens over a 26-token cached prefix (prefix-cache hit, or an
    # earlier chunk); 2 new over 7. Tiles of 4-16 query tokens x 16 keys: several per chunk, both the
    # unmasked and the causal loop.
    step = make_step([(19, 19), (37, 11), (9, 2)], 0, heads, kv_heads, head_dim, 8, dtype, seed=5)
    run_both(step, TritonAttentionBackend(prefill_block_m=16 // (heads // kv_heads), prefill_block_n=16))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mixed_batch_of_decodes_then_prefill_chunks(dtype):
    seqs = [(40, 1), (1, 1), (17, 1), (0, 1), (23, 23), (50, 14)]
    step = make_step(seqs, 4, 8, 2, 32, 16, dtype, seed=6)
    run_both(step, TritonAttentionBackend(decode_partition=32, decode_block_n=16,
                                          prefill_block_m=4, prefill_block_n=16))


def test_mixed_batch_with_default_tiles():
    step = make_step([(70, 1), (5, 1), (33, 33), (90, 20)], 2, 8, 2, 32, 16, torch.float32, seed=7)
    run_both(step, TritonAttentionBackend())


@pytest.mark.parametrize("offsets_64", [False, True], ids=["32-bit-offsets", "64-bit-offsets"])
def test_int32_slots_and_block_tables_give_the_same_result(monkeypatch, offsets_64):
    # A pool of 2**31 elements or more switches the kernels to 64-bit offsets (forced here on a tiny
    # one); slots and block tables may come as int32, which must then be widened before the multiply.
    monkeypatch.setattr(_kernels(), "_needs_64bit_offsets", lambda k_cache: offsets_64)
    step = make_step([(40, 1), (0, 1), (17, 1), (23, 23), (50, 14)], 3, 8, 2, 32, 16, torch.float32, seed=8)
    backend = TritonAttentionBackend(decode_partition=32, decode_block_n=16, prefill_block_m=4,
                                     prefill_block_n=16)
    run_both(step, backend)
    meta = step.meta()
    want_k, want_v = step.k_cache.clone(), step.v_cache.clone()
    want = backend.forward(step.q, step.k, step.v, want_k, want_v, meta, 0.2)
    meta.slot_mapping, meta.block_tables = meta.slot_mapping.int(), meta.block_tables.int()
    got_k, got_v = step.k_cache.clone(), step.v_cache.clone()
    got = backend.forward(step.q, step.k, step.v, got_k, got_v, meta, 0.2)
    assert torch.equal(got, want) and torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def test_64_bit_offsets_follow_the_largest_offset_the_pool_reaches():
    # Shapes and strides only (meta tensors): the kernels add block * stride(0) + ... to the pool's
    # pointer, so what counts is the largest offset, not the element count.
    needs = _kernels()._needs_64bit_offsets
    per_block = 16 * 8 * 128  # block size 16, 8 KV heads of 128 (Qwen3-0.6B, Llama-3-8B)
    just_fits = torch.empty(2, 2**31 // per_block - 1, 16, 8, 128, device="meta")[0]
    assert not needs(just_fits)
    past = torch.empty(2, 2**31 // per_block, 16, 8, 128, device="meta")  # 2**31 elements per layer
    assert needs(past[0]) and needs(past[1])
    # K and V interleaved per block: each view holds under 2**31 elements but spans more.
    interleaved = torch.empty(2**31 // (2 * per_block) + 1, 2, 16, 8, 128, device="meta")
    assert interleaved[:, 0].numel() < 2**31 and needs(interleaved[:, 0])


@pytest.mark.parametrize("layout", ["engine", "interleaved"])
def test_blocks_past_2_31_elements_into_the_pool_are_read_and_written_where_they_are(layout):
    """A real pool of more than 2**31 elements, used only at its far end: 32-bit offsets would wrap
    there and read or write somewhere else (under the interpreter: a crash). On an H200 a model of
    up to ~14 layers gets such a pool (120 GB of KV over 14 layers is 2.1e9 bf16 elements per K).
    The storage is allocated without being touched: on the CPU only the used blocks' pages are
    ever committed, on CUDA it is 4-8 GiB."""
    kv_heads, head_dim, bs, heads = 2, 64, 16, 8
    per_block = bs * kv_heads * head_dim
    dtype = torch.float16  # what the interpreter computes right; on CUDA as good as bf16 here
    if layout == "engine":  # the model runner's [2, blocks, ...] per layer: K and V each past 2**31
        num_blocks = 2**31 // per_block + 2
        pool = torch.empty(2, num_blocks, bs, kv_heads, head_dim, dtype=dtype, device=DEVICE)
        k_cache, v_cache = pool[0], pool[1]
    else:  # K and V interleaved per block: each under 2**31 elements, spanning past it
        num_blocks = 2**31 // (2 * per_block) + 2
        pool = torch.empty(num_blocks, 2, bs, kv_heads, head_dim, dtype=dtype, device=DEVICE)
        k_cache, v_cache = pool[:, 0], pool[:, 1]
    assert _kernels()._needs_64bit_offsets(k_cache)
    far = [num_blocks - 1, 3, num_blocks - 2, num_blocks - 4]  # physical blocks, in table order
    gen = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)

    for b in far:  # only these blocks are ever read or written
        k_cache[b], v_cache[b] = randn(bs, kv_heads, head_dim), randn(bs, kv_heads, head_dim)
    # One decode (context 50: the far blocks) and a 12-token chunk over a 28-token cached prefix.
    seqs = [(50, 1), (40, 12)]
    tables = [far, [far[2], far[0], far[3]]]
    q, k, v = randn(13, heads, head_dim), randn(13, kv_heads, head_dim), randn(13, kv_heads, head_dim)
    small_ids = {b: i for i, b in enumerate(far)}  # the same blocks in a small pool, for the reference
    small_k = torch.stack([k_cache[b] for b in far]).float()
    small_v = torch.stack([v_cache[b] for b in far]).float()

    def meta(remap) -> AttentionMetadata:
        slots, lens = [], []
        for (ctx, new), table in zip(seqs, tables, strict=True):
            slots += [remap(table[p // bs]) * bs + p % bs for p in range(ctx - new, ctx)]
            lens.append(ctx)
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            block_tables=torch.tensor([[remap(b) for b in t] + [0] * (4 - len(t)) for t in tables],
                                      dtype=torch.int64, device=DEVICE),
            context_lens=torch.tensor(lens, dtype=torch.int64, device=DEVICE),
            query_start=[0, 1, 13], context_lens_host=lens, num_decodes=1)

    for partition in (None, 16):  # the decode in one partition, then split and reduced
        got = TritonAttentionBackend(decode_partition=partition, decode_block_n=16, prefill_block_m=4,
                                     prefill_block_n=16).forward(q, k, v, k_cache, v_cache,
                                                                 meta(lambda b: b), 0.125)
        want_k, want_v = small_k.clone(), small_v.clone()
        want = TorchAttentionBackend().forward(q.float(), k.float(), v.float(), want_k, want_v,
                                               meta(small_ids.__getitem__), 0.125)
        assert (got.float() - want).abs().max().item() <= TOL[dtype]
        written_k = torch.stack([k_cache[b] for b in far]).float()
        written_v = torch.stack([v_cache[b] for b in far]).float()
        assert torch.equal(written_k, want_k) and torch.equal(written_v, want_v), "KV written elsewhere"


def test_backend_choice_follows_device_and_environment(monkeypatch):
    monkeypatch.delenv("OPENCLAW_ATTENTION", raising=False)
    assert isinstance(get_backend(torch.device("cpu")), TorchAttentionBackend)
    if DEVICE.type == "cuda":
        assert isinstance(get_backend(DEVICE), TritonAttentionBackend)
    else:  # forcing Triton on the CPU works only under the interpreter, which is on here
        monkeypatch.setenv("OPENCLAW_ATTENTION", "triton")
        assert isinstance(get_backend(torch.device("cpu")), TritonAttentionBackend)
    monkeypatch.setenv("OPENCLAW_ATTENTION", "torch")
    assert isinstance(get_backend(torch.device("cuda")), TorchAttentionBackend)
    monkeypatch.setenv("OPENCLAW_ATTENTION", "flash")
    with pytest.raises(ValueError, match="not a backend"):
        get_backend(torch.device("cpu"))


def test_forcing_triton_without_a_way_to_run_it_names_the_fix(monkeypatch):
    monkeypatch.setenv("OPENCLAW_ATTENTION", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read per call by get_backend; kernels stay as wrapped
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        get_backend(torch.device("cpu"))


def test_the_benchmarks_reference_check_runs_and_passes_at_tiny_shapes():
    from engine.attention.triton_check import check_against_reference

    results = dict(check_against_reference(DEVICE, torch.float32, num_decodes=4, max_context=40,
                                           prefill=((13, 13), (30, 11), (9, 2)), heads=4, kv_heads=2,
                                           head_dim=32, block_size=8))
    assert {"store_kv", "decode_attention", "prefill_attention", "decode_padding_row_abs"} <= set(results)
    assert results["store_kv"] == 0 and results["decode_padding_row_abs"] == 0
    assert max(results.values()) <= TOL[torch.float32], results


def test_choosing_a_backend_on_the_cpu_does_not_import_triton():
    code = ("import sys, torch; from engine.attention import get_backend; get_backend(torch.device('cpu')); "
            "print('triton' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OPENCLAW_ATTENTION")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"
