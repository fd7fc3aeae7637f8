"""Triton kernels for paged attention: KV write, split-context decode (+ reduce), prefill/extend.

Pool layout (per layer): k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]; token p of
a sequence lives in physical block block_table[p // block_size] at offset p % block_size.

Import this module only on CUDA or under TRITON_INTERPRET=1: `@triton.jit` picks the interpreter at
decoration time, and a launch without either fails with "0 active drivers".

Softmax runs in base 2 (exp2/log2 with log2(e) folded into the scale); the decode partials' lse are
base-2 too, and only the reduce kernel reads them.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.kernels.interpreter_compat import fix_interpreter_index

# Loops below run over loaded bounds (range(part_start, part_end, BLOCK_N)), which triton < 3.8's
# interpreter cannot take under numpy >= 2.4; see interpreter_compat. Compiled kernels are untouched.
fix_interpreter_index()

_LOG2E = 1.4426950408889634
# Decode partials (fp32 [num_seqs, num_heads, num_splits, head_dim]) stay under this many elements:
# wide block tables (a CUDA graph captured for max_model_len) get longer partitions instead.
_PARTIAL_BUDGET = 16 * 2**20
_MAX_SPLITS = 128


# ---------------------------------------------------------------------------------------------
# Kernel 1: new K/V into the pool
# ---------------------------------------------------------------------------------------------


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEADS_P: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    # One program per token, all KV heads at once (num_kv_heads * head_dim elements: one wide row).
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)  # 64-bit whatever the slot dtype: pools pass 2**31
    heads = tl.arange(0, HEADS_P)
    dims = tl.arange(0, HEAD_DIM_P)
    # slot -1 pads a CUDA-graph batch: a head_dim bound of 0 masks every lane. (Not `& (slot >= 0)`:
    # the interpreter turns a block mask and-ed with a loaded scalar into int32 and rejects it.)
    dim_limit = tl.where(slot >= 0, HEAD_DIM, 0)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < dim_limit)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs \
        + heads[:, None] * stride_ch + dims[None, :]
    k = tl.load(k_ptr + tok * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k/v [num_tokens, kv_heads, head_dim] (any row stride) into the pool at slot_mapping; -1 skips."""
    num_tokens, kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _check_pool(k_cache, v_cache, kv_heads, head_dim)
    assert k.stride(2) == 1 and v.stride(2) == 1, "k/v need a contiguous last dimension"
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=kv_heads, HEADS_P=triton.next_power_of_2(kv_heads),
        HEAD_DIM=head_dim, HEAD_DIM_P=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1],
        num_warps=4,
    )


# ---------------------------------------------------------------------------------------------
# Shared inner step: one BLOCK_N tile of keys gathered through the block table, online softmax
# ---------------------------------------------------------------------------------------------


@triton.jit
def _attend_tile(
    q, m, l, acc, k_cache_ptr, v_cache_ptr, table_ptr, start, kv_head, dims, dim_mask,
    key_limit, q_pos, scale_log2, stride_cb, stride_cs, stride_ch,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    BOUNDED: tl.constexpr, CAUSAL: tl.constexpr, OFFSETS_64: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Fold keys start..start+BLOCK_N into (m, l, acc) for every query row of q [ROWS, HEAD_DIM_P].

    BOUNDED masks keys >= key_limit; CAUSAL masks keys after each row's position q_pos [ROWS].
    Tiles entirely inside the context and before every row take neither mask (the common case).
    """
    keys = start + tl.arange(0, BLOCK_N)
    if BOUNDED:
        key_mask = keys < key_limit
        pages = tl.load(table_ptr + keys // BLOCK_SIZE, mask=key_mask, other=0)
        kv_mask = key_mask[:, None] & dim_mask[None, :]
    else:
        pages = tl.load(table_ptr + keys // BLOCK_SIZE)
        kv_mask = dim_mask[None, :]  # tl.load broadcasts it over the keys
    if OFFSETS_64:
        pages = pages.to(tl.int64)  # an int32 block table would otherwise overflow pages * stride_cb
    else:
        # 32-bit element offsets when the pool allows: 64-bit ones cost enough registers to spill.
        pages = pages.to(tl.int32)
    offs = pages * stride_cb + (keys % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
    k = tl.load(k_cache_ptr + offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [ROWS, BLOCK_N] fp32
    if BOUNDED:
        s = tl.where(key_mask[None, :], s, float("-inf"))
    if CAUSAL:
        s = tl.where(keys[None, :] <= q_pos[:, None], s, float("-inf"))
    # Callers guarantee every row sees at least one key in its first tile, so m_new is finite.
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l, acc


# ---------------------------------------------------------------------------------------------
# Kernel 2: decode (one query token per sequence), flash-decoding split + reduce
# ---------------------------------------------------------------------------------------------


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, lens_ptr, o_ptr, lse_ptr,
    scale_log2, partition,
    stride_qs, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
    stride_os, stride_oh, stride_op, stride_ls, stride_lh,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, WRITE_LSE: tl.constexpr,
    OFFSETS_64: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Grid (num_seqs, num_kv_heads, num_splits), all from tensor shapes (CUDA-graph safe). One program
    # serves the GROUP query heads of one KV head, so each K/V tile is read once per KV head.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + seq).to(tl.int32)
    part_start = split * partition
    # Partitions past the context do nothing: the reduce only reads cdiv(ctx, partition) of them.
    # Split 0 always runs so that a padding row (ctx 0) still writes zeros when there is no reduce.
    if part_start >= tl.maximum(ctx, 1):
        return
    part_end = tl.minimum(part_start + partition, ctx)

    rows = tl.arange(0, GROUP_P)  # padded to 16 for tl.dot; rows >= GROUP are zeros, never stored
    dims = tl.arange(0, HEAD_DIM_P)
    dim_mask = dims < HEAD_DIM
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    q_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)

    m = tl.full([GROUP_P], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], tl.float32)
    table = tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(part_start, part_end, BLOCK_N):
        m, l, acc = _attend_tile(
            q, m, l, acc, k_cache_ptr, v_cache_ptr, table, start, kv_head, dims, dim_mask,
            part_end, rows, scale_log2, stride_cb, stride_cs, stride_ch,
            BLOCK_SIZE, BLOCK_N, True, False, OFFSETS_64, DOT_PRECISION)

    l_safe = tl.where(l > 0, l, 1.0)  # l == 0 only for ctx 0: zeros, not NaN
    out = acc / l_safe[:, None]
    o_offs = seq * stride_os + heads[:, None] * stride_oh + split * stride_op + dims[None, :]
    tl.store(o_ptr + o_offs, out.to(o_ptr.dtype.element_ty), mask=q_mask)
    if WRITE_LSE:
        tl.store(lse_ptr + seq * stride_ls + heads * stride_lh + split, m + tl.log2(l_safe), mask=row_mask)


@triton.jit
def _decode_reduce_kernel(
    part_o_ptr, part_lse_ptr, lens_ptr, o_ptr, partition,
    stride_ps, stride_ph, stride_pp, stride_ls, stride_lh, stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):
    # Grid (num_seqs, num_heads). Combines the cdiv(ctx, partition) partials that hold keys, each
    # weighted by exp2(lse - max lse); partitions past the context were never written and are skipped.
    seq = tl.program_id(0)
    head = tl.program_id(1)
    ctx = tl.load(lens_ptr + seq).to(tl.int32)
    num_parts = tl.cdiv(ctx, partition)
    lse_row = part_lse_ptr + seq * stride_ls + head * stride_lh
    part_row = part_o_ptr + seq * stride_ps + head * stride_ph
    dims = tl.arange(0, HEAD_DIM_P)
    dim_mask = dims < HEAD_DIM

    m_vec = tl.full([SPLIT_BLOCK], float("-inf"), tl.float32)
    for first in range(0, num_parts, SPLIT_BLOCK):
        parts = first + tl.arange(0, SPLIT_BLOCK)
        m_vec = tl.maximum(m_vec, tl.load(lse_row + parts, mask=parts < num_parts, other=float("-inf")))
    m = tl.max(m_vec, 0)

    acc = tl.zeros([HEAD_DIM_P], tl.float32)
    denom = tl.zeros([SPLIT_BLOCK], tl.float32)
    for first in range(0, num_parts, SPLIT_BLOCK):
        parts = first + tl.arange(0, SPLIT_BLOCK)
        part_mask = parts < num_parts
        lse = tl.load(lse_row + parts, mask=part_mask, other=float("-inf"))
        w = tl.where(part_mask, tl.exp2(lse - m), 0.0)
        o = tl.load(part_row + parts[:, None] * stride_pp + dims[None, :],
                    mask=part_mask[:, None] & dim_mask[None, :], other=0.0)
        acc += tl.sum(o * w[:, None], 0)
        denom += w
    total = tl.sum(denom, 0)
    out = acc / tl.where(total > 0, total, 1.0)  # ctx 0 (a padding row): no parts, zeros
    tl.store(o_ptr + seq * stride_os + head * stride_oh + dims, out.to(o_ptr.dtype.element_ty), mask=dim_mask)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     out: torch.Tensor, partition_size: int | None = None,
                     block_n: int | None = None) -> None:
    """One query token per sequence: q, out [num_seqs, num_heads, head_dim]; writes out in place.

    Reads only device tensors, and the grid and buffers come from shapes alone, so a CUDA graph can
    capture it. partition_size / block_n override the tuning (tests use tiny ones).
    """
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    _check_pool(k_cache, v_cache, kv_heads, head_dim, q)
    assert q.stride(2) == 1 and out.stride(2) == 1, "q/out need a contiguous last dimension"
    assert num_heads % kv_heads == 0, f"{num_heads} query heads do not split over {kv_heads} KV heads"
    if num_seqs == 0:
        return
    group = num_heads // kv_heads
    head_dim_p = _padded_head_dim(head_dim)
    block_size = k_cache.shape[1]
    offsets_64 = _needs_64bit_offsets(k_cache)
    default_n, num_warps = _decode_tiles(head_dim_p, q.dtype, offsets_64)
    block_n = block_n or default_n
    max_tokens = block_tables.shape[1] * block_size
    if partition_size is None:
        partition_size = _decode_partition(num_seqs, kv_heads, num_heads, head_dim_p, max_tokens,
                                           block_n, q.device)
    assert partition_size % block_n == 0, "the decode partition must be a multiple of block_n"
    num_splits = max(1, triton.cdiv(max_tokens, partition_size))
    single = num_splits == 1
    if single:  # the whole context fits one partition: write the output directly, no reduce
        part_o, lse = out, out  # lse is not written (WRITE_LSE=False); any pointer will do
        o_strides = (out.stride(0), out.stride(1), 0)
        lse_strides = (0, 0)
    else:
        part_o = torch.empty((num_seqs, num_heads, num_splits, head_dim_p), dtype=torch.float32,
                             device=q.device)
        lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        o_strides = (part_o.stride(0), part_o.stride(1), part_o.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
    _decode_kernel[(num_seqs, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, part_o, lse,
        scale * _LOG2E, partition_size,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), *o_strides, *lse_strides,
        GROUP=group, GROUP_P=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        HEAD_DIM_P=head_dim_p, BLOCK_SIZE=block_size, BLOCK_N=block_n, WRITE_LSE=not single,
        OFFSETS_64=offsets_64, DOT_PRECISION=_dot_precision(q.dtype), num_warps=num_warps, num_stages=2,
    )
    if not single:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_o, lse, context_lens, out, partition_size,
            part_o.stride(0), part_o.stride(1), part_o.stride(2), lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_P=head_dim_p, SPLIT_BLOCK=16, num_warps=4,
        )


# ---------------------------------------------------------------------------------------------
# Kernel 3: prefill / extend (chunks whose earlier tokens are already in the pool)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, lens_ptr, starts_ptr, o_ptr, scale_log2,
    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    OFFSETS_64: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Grid (cdiv(max chunk, BLOCK_M), num_chunks, num_kv_heads). A program takes BLOCK_M query tokens
    # times the GROUP heads of one KV head as BLOCK_M * GROUP_P rows (row r: token r // GROUP_P,
    # head r % GROUP_P), so each K/V tile feeds all heads of the group from one read.
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(starts_ptr + seq).to(tl.int32)
    chunk = tl.load(starts_ptr + seq + 1).to(tl.int32) - q_start
    tile_start = tile * BLOCK_M
    if tile_start >= chunk:  # tiles past this chunk's end (the grid fits the longest chunk)
        return
    ctx = tl.load(lens_ptr + seq).to(tl.int32)
    prefix = ctx - chunk  # pool tokens before this chunk (prefix-cache hit or earlier chunks)

    rows = tl.arange(0, BLOCK_M * GROUP_P)
    toks = tile_start + rows // GROUP_P
    group_idx = rows % GROUP_P
    heads = kv_head * GROUP + group_idx
    dims = tl.arange(0, HEAD_DIM_P)
    dim_mask = dims < HEAD_DIM
    row_mask = (toks < chunk) & (group_idx < GROUP)
    q_mask = row_mask[:, None] & dim_mask[None, :]
    q_rows = (q_start + toks).to(tl.int64) * stride_qt + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :], mask=q_mask, other=0.0)
    q_pos = prefix + toks  # rows past the chunk get positions >= ctx; never stored

    m = tl.full([BLOCK_M * GROUP_P], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M * GROUP_P], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_P, HEAD_DIM_P], tl.float32)
    table = tables_ptr + seq.to(tl.int64) * stride_bt
    # Keys before the tile's first position are visible to every row: whole tiles of them need no mask.
    full_end = (prefix + tile_start) // BLOCK_N * BLOCK_N
    kv_end = tl.minimum(ctx, prefix + tile_start + BLOCK_M)
    for start in range(0, full_end, BLOCK_N):
        m, l, acc = _attend_tile(
            q, m, l, acc, k_cache_ptr, v_cache_ptr, table, start, kv_head, dims, dim_mask,
            kv_end, q_pos, scale_log2, stride_cb, stride_cs, stride_ch,
            BLOCK_SIZE, BLOCK_N, False, False, OFFSETS_64, DOT_PRECISION)
    # The diagonal: causal mask per row. Its first tile starts at or before every row's position,
    # so no row is fully masked while m is still -inf.
    for start in range(full_end, kv_end, BLOCK_N):
        m, l, acc = _attend_tile(
            q, m, l, acc, k_cache_ptr, v_cache_ptr, table, start, kv_head, dims, dim_mask,
            kv_end, q_pos, scale_log2, stride_cb, stride_cs, stride_ch,
            BLOCK_SIZE, BLOCK_N, True, True, OFFSETS_64, DOT_PRECISION)

    out = acc / l[:, None]
    o_rows = (q_start + toks).to(tl.int64) * stride_ot + heads * stride_oh
    tl.store(o_ptr + o_rows[:, None] + dims[None, :], out.to(o_ptr.dtype.element_ty), mask=q_mask)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, context_lens: torch.Tensor,
                      query_start: torch.Tensor, max_query_len: int, scale: float, out: torch.Tensor,
                      block_m: int | None = None, block_n: int | None = None) -> None:
    """Causal attention of chunks over the pool. Chunk s is rows query_start[s]:query_start[s + 1] of
    q/out [num_tokens, num_heads, head_dim]; block_tables/context_lens hold one row per chunk, and the
    chunk's own K/V must already be in the pool. block_m (query tokens per program) / block_n override
    the tuning (tests use tiny ones)."""
    num_heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[2]
    num_chunks = query_start.shape[0] - 1
    _check_pool(k_cache, v_cache, kv_heads, head_dim, q)
    assert q.stride(2) == 1 and out.stride(2) == 1, "q/out need a contiguous last dimension"
    assert num_heads % kv_heads == 0, f"{num_heads} query heads do not split over {kv_heads} KV heads"
    if num_chunks == 0 or max_query_len == 0:
        return
    group = num_heads // kv_heads
    group_p = triton.next_power_of_2(group)
    head_dim_p = _padded_head_dim(head_dim)
    rows, default_n = _prefill_tiles(head_dim_p, q.dtype)
    block_m = block_m or max(1, rows // group_p)  # the query tokens that give `rows` rows
    block_n = block_n or default_n
    assert block_m * group_p >= 16, "tl.dot needs at least 16 query rows per program"
    grid = (triton.cdiv(max_query_len, block_m), num_chunks, kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, context_lens, query_start, out, scale * _LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, GROUP_P=group_p, HEAD_DIM=head_dim, HEAD_DIM_P=head_dim_p,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_N=block_n,
        OFFSETS_64=_needs_64bit_offsets(k_cache), DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=8, num_stages=2,
    )


# ---------------------------------------------------------------------------------------------
# Launch helpers
# ---------------------------------------------------------------------------------------------


def _check_pool(k_cache: torch.Tensor, v_cache: torch.Tensor, kv_heads: int, head_dim: int,
                q: torch.Tensor | None = None) -> None:
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride(), \
        "k_cache and v_cache must share one layout"
    assert k_cache.shape[2:] == (kv_heads, head_dim), \
        f"pool is {tuple(k_cache.shape)}, tokens have {kv_heads} KV heads of {head_dim}"
    assert k_cache.stride(3) == 1, "the pool needs a contiguous head_dim"
    # tl.dot takes one dtype on both sides: queries and pool must match.
    assert q is None or q.dtype == k_cache.dtype, f"queries are {q.dtype}, the pool is {k_cache.dtype}"


# Tile sizes: the largest that compile for sm_90 without register spills (ptxas -v via triton 3.9,
# checked for head_dim 64/80/128/256 and groups 1-8; MHA prefill at head_dim 128 spills 8 bytes).
# fp32 runs tl.dot as exact FMAs ("ieee"), which needs far more registers: smaller tiles.


def _decode_tiles(head_dim_p: int, dtype: torch.dtype, offsets_64: bool) -> tuple[int, int]:
    """(keys per tile, warps) of the decode kernel."""
    if dtype == torch.float32:
        return (32 if head_dim_p <= 128 else 16), 8
    return (64 if head_dim_p <= 128 and not offsets_64 else 32), 4


def _prefill_tiles(head_dim_p: int, dtype: torch.dtype) -> tuple[int, int]:
    """(query rows, keys) per tile of the prefill kernel, which always runs 8 warps."""
    if dtype == torch.float32:
        return 32, 16
    return (128, 64) if head_dim_p <= 64 else (128, 32) if head_dim_p <= 128 else (32, 32)


def _needs_64bit_offsets(k_cache: torch.Tensor) -> bool:
    # Fixed per pool, so a constexpr costs one compile per model, not one per step. The kernels add
    # block * stride(0) + offset * stride(1) + head * stride(2) + dim to the pool's pointer: what
    # decides is the largest such offset, which a strided view (K and V interleaved per block, say)
    # reaches with fewer elements than it spans. For a contiguous pool it is numel() - 1.
    reach = sum((size - 1) * stride for size, stride in zip(k_cache.shape, k_cache.stride(), strict=True))
    return k_cache.numel() > 0 and reach >= 2**31 - 1


def _padded_head_dim(head_dim: int) -> int:
    # tl.arange needs a power of two and tl.dot a K of at least 16; 80 or 96 pad to 128 under masks.
    assert head_dim <= 256, f"head_dim {head_dim} > 256 does not fit these kernels' tiles"
    return max(16, triton.next_power_of_2(head_dim))


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 on a GPU would otherwise run through TF32 (10-bit mantissa); fp16/bf16 ignore this.
    return "ieee" if dtype == torch.float32 else "tf32"


def _decode_partition(num_seqs: int, kv_heads: int, num_heads: int, head_dim_p: int, max_tokens: int,
                      block_n: int, device: torch.device) -> int:
    """Tokens per decode program. Shorter partitions when few (sequence, KV head) pairs would leave
    SMs idle; longer ones when the table is so wide that the partials would grow past the budget.
    Depends on shapes only, and is a runtime argument, so a new value never recompiles."""
    programs = num_seqs * kv_heads
    sms = _num_sms(device)
    partition = 128 if programs < sms else 256 if programs < 4 * sms else 512
    max_splits = max(1, min(_MAX_SPLITS, _PARTIAL_BUDGET // (num_seqs * num_heads * head_dim_p)))
    needed = triton.cdiv(triton.cdiv(max_tokens, max_splits), block_n) * block_n
    return max(partition, needed)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: the value only shapes tests' partitions
    return torch.cuda.get_device_properties(device).multi_processor_count
