"""The torch reference backend against dense attention computed per sequence: ragged lengths,
block tables out of order, lengths not multiples of the block size, shared prefix blocks."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttentionBackend
from engine.model_runner import block_run_starts, shared_prefix_blocks


def dense(q, k, v, scale):
    """Causal attention of the last len(q) positions over all of k/v; GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    offset = k.shape[0] - q.shape[0]
    mask = torch.arange(k.shape[0])[None, :] > (torch.arange(q.shape[0])[:, None] + offset)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


# (shared prefix blocks, each decode's own tokens after them): a tail of 0 is a decode whose
# whole context is the shared blocks, which is attended in the shared part alone.
@pytest.mark.parametrize("shared_blocks, tails", [(0, (5, 9, 2)), (3, (5, 9, 2)), (3, (0, 9, 2)),
                                                  (3, (0, 0, 0))])
def test_batched_decodes_and_prefill_chunks_match_dense_attention(shared_blocks, tails):
    torch.manual_seed(0)
    bs, kv_heads, heads, dim, num_blocks = 4, 2, 6, 8, 64
    k_cache = torch.randn(num_blocks, bs, kv_heads, dim)
    v_cache = torch.randn(num_blocks, bs, kv_heads, dim)
    perm = torch.randperm(num_blocks).tolist()  # blocks handed out in no particular order
    common = perm[:shared_blocks]
    # (context length, new tokens): three decodes, then two prefill chunks with earlier context
    seqs = [(shared_blocks * bs + tail, 1) for tail in tails]
    seqs += [(shared_blocks * bs + 7, 7), (shared_blocks * bs + 14, 6)]
    tables, cursor = [], shared_blocks
    for ctx, _ in seqs:
        own = math.ceil(ctx / bs) - shared_blocks
        tables.append(common + perm[cursor:cursor + own])
        cursor += own
    dense_k, dense_v, qs, slots, query_start = [], [], [], [], [0]
    for (ctx, new), table in zip(seqs, tables, strict=True):
        positions = range(ctx)
        flat = [table[p // bs] * bs + p % bs for p in positions]
        k_all = k_cache.view(-1, kv_heads, dim)[flat].clone()
        v_all = v_cache.view(-1, kv_heads, dim)[flat].clone()
        dense_k.append(k_all)
        dense_v.append(v_all)
        qs.append(torch.randn(new, heads, dim))
        slots += flat[ctx - new:]
        query_start.append(query_start[-1] + new)
    width = max(len(t) for t in tables)
    ctx_lens = [c for c, _ in seqs]
    shared = shared_prefix_blocks(tables[:3], ctx_lens[:3], bs)
    assert shared == shared_blocks
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        context_lens=torch.tensor(ctx_lens), query_start=query_start,
        context_lens_host=ctx_lens, num_decodes=3, num_shared_decode_blocks=shared)
    q = torch.cat(qs)
    # the new tokens' K/V are what the backend writes; they equal what is already there
    k_new = torch.cat([dk[c - n:] for dk, (c, n) in zip(dense_k, seqs, strict=True)])
    v_new = torch.cat([dv[c - n:] for dv, (c, n) in zip(dense_v, seqs, strict=True)])
    out = TorchAttentionBackend().forward(q, k_new, v_new, k_cache, v_cache, meta, dim**-0.5)
    for s, (qi, ki, vi) in enumerate(zip(qs, dense_k, dense_v, strict=True)):
        expected = dense(qi, ki, vi, dim**-0.5)
        got = out[query_start[s]:query_start[s + 1]]
        assert torch.allclose(got, expected, atol=1e-5), f"sequence {s}"


def test_shared_prefix_needs_the_same_physical_blocks_in_every_row():
    assert shared_prefix_blocks([[5, 6, 7], [5, 6, 9]], [12, 12], 4) == 2
    assert shared_prefix_blocks([[5, 6, 7], [5, 6, 7]], [12, 7], 4) == 1  # only full blocks
    assert shared_prefix_blocks([[5, 6, 7]], [12], 4) == 0  # one sequence: nothing to share


def test_block_runs_are_found_for_a_lone_decode_and_prefills_after_context_only():
    bs = 4
    # a lone decode on blocks 7, 8, 9 (context 10: three blocks), and on 7, 9, 8: not a run
    assert block_run_starts([[7, 8, 9]], [10], [0, 1], 1, bs) == [7]
    assert block_run_starts([[7, 9, 8]], [10], [0, 1], 1, bs) == [-1]
    # only the blocks that hold the context count; a later table entry may be anything
    assert block_run_starts([[7, 8, 2]], [8], [0, 1], 1, bs) == [7]
    # a batch of decodes is attended as one tensor: no runs; a fresh prefill needs no pool read
    assert block_run_starts([[3, 4], [5, 6]], [6, 6], [0, 1, 2], 2, bs) == [-1, -1]
    assert block_run_starts([[3, 4], [5, 6]], [6, 8], [0, 1, 4], 1, bs) == [3, 5]
    assert block_run_starts([[3, 4], [5, 6]], [6, 8], [0, 1, 9], 1, bs) == [3, -1]
    assert block_run_starts([[5, 6]], [8], [0, 8], 0, bs) == [-1]


def single_sequence_meta(table, ctx, new, bs, starts):
    slots = [table[p // bs] * bs + p % bs for p in range(ctx - new, ctx)]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots), block_tables=torch.tensor([table]),
        context_lens=torch.tensor([ctx]), query_start=[0, new], context_lens_host=[ctx],
        num_decodes=int(new == 1), block_run_starts=starts)


@pytest.mark.parametrize("new", [1, 5])  # a decode; a prefill chunk after earlier context
def test_consecutive_blocks_are_read_in_place_with_the_bits_of_the_gathered_copy(new):
    """A lone sequence on consecutive blocks attends over a view of the pool: no index_select
    copy of its context (per layer and step at batch 1), and exactly the gathered result."""
    torch.manual_seed(1)
    bs, kv_heads, heads, dim, ctx = 4, 2, 6, 8, 23
    k_cache, v_cache = torch.randn(16, bs, kv_heads, dim), torch.randn(16, bs, kv_heads, dim)
    table = list(range(9, 15))
    q = torch.randn(new, heads, dim)
    flat = [table[p // bs] * bs + p % bs for p in range(ctx - new, ctx)]
    k_new, v_new = k_cache.view(-1, kv_heads, dim)[flat], v_cache.view(-1, kv_heads, dim)[flat]
    backend = TorchAttentionBackend()
    starts = block_run_starts([table], [ctx], [0, new], int(new == 1), bs)
    assert starts == [9]
    gathered = backend.forward(q, k_new, v_new, k_cache, v_cache,
                               single_sequence_meta(table, ctx, new, bs, []), dim**-0.5)
    with torch.profiler.profile() as prof:
        in_place = backend.forward(q, k_new, v_new, k_cache, v_cache,
                                   single_sequence_meta(table, ctx, new, bs, starts), dim**-0.5)
    copies = [e.key for e in prof.key_averages() if e.key in ("aten::index_select", "aten::index")]
    assert copies == []
    assert torch.equal(in_place, gathered)
