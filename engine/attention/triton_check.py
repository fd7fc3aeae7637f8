"""Each Triton attention kernel against the torch reference at realistic shapes, for the GPU benchmark.

`check_against_reference("cuda", torch.bfloat16)` builds one Qwen3-0.6B-shaped step (16 heads, 8 KV
heads, head_dim 128, block size 16): 64 decodes with contexts up to 2048 (one of length 1, one padding
row of context 0), then prefill chunks with and without a cached prefix, over a pool whose blocks are
handed out in random order. The reference runs in fp32 on the same (rounded) values, so the errors
are the kernels' own: 0 for the KV write, about 1e-2 for bf16 attention, 1e-3 for fp16.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from engine.attention.base import AttentionMetadata
from engine.attention.torch_ref import TorchAttentionBackend, write_kv
from engine.attention.triton_backend import TritonAttentionBackend


def check_against_reference(
    device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16, *,
    num_decodes: int = 64, max_context: int = 2048,
    prefill: Sequence[tuple[int, int]] = ((300, 300), (700, 200), (1040, 17)),
    heads: int = 16, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16, seed: int = 0,
) -> list[tuple[str, float]]:
    """(check name, max abs error) per check. `prefill` lists (context incl. the chunk, chunk length);
    a context longer than its chunk reads a cached prefix from the pool. On CUDA it also replays the
    decode step from a captured CUDA graph with new contents in the same tensors."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    assert num_decodes >= 3, "the decode batch holds a long, a length-1 and a padding row"
    lens = torch.randint(1, max_context + 1, (num_decodes,), generator=gen).tolist()
    lens[:3] = [max_context, 1, 0]
    seqs = [(n, 1) for n in lens] + list(prefill)

    # Every sequence (the padding row too) owns its blocks, handed out in random order.
    counts = [math.ceil(max(ctx, 1) / block_size) for ctx, _ in seqs]
    num_blocks = sum(counts) + 8
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [perm[sum(counts[:i]):sum(counts[:i + 1])] for i in range(len(counts))]

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    k_cache = randn(num_blocks, block_size, kv_heads, head_dim)
    v_cache = randn(num_blocks, block_size, kv_heads, head_dim)
    num_tokens = sum(n for _, n in seqs)
    q, k, v = randn(num_tokens, heads, head_dim), randn(num_tokens, kv_heads, head_dim), \
        randn(num_tokens, kv_heads, head_dim)
    results = [("store_kv", _check_store_kv(k, v, k_cache, v_cache, gen))]

    scale = head_dim**-0.5
    meta = _metadata(seqs, tables, range(len(seqs)), num_decodes, block_size, device)
    got = TritonAttentionBackend().forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, scale)
    # The reference takes neither slot -1 nor context 0: it runs without the padding row.
    keep = [s for s, (ctx, _) in enumerate(seqs) if ctx > 0]
    rows = _token_rows(seqs, keep)
    ref_meta = _metadata(seqs, tables, keep, num_decodes, block_size, device)
    want = TorchAttentionBackend().forward(q[rows].float(), k[rows].float(), v[rows].float(),
                                           k_cache.float(), v_cache.float(), ref_meta, scale)
    err = (got[rows].float() - want).abs()
    decode_rows = sum(1 for s in keep if s < num_decodes)
    results.append(("decode_attention", err[:decode_rows].max().item()))
    results.append(("prefill_attention", err[decode_rows:].max().item()))
    results.append(("decode_padding_row_abs", got[2].abs().max().item()))  # must be exactly 0
    if device.type == "cuda":
        results.append(("decode_cuda_graph_replay", _check_graph_replay(
            q[:num_decodes], k[:num_decodes], v[:num_decodes], k_cache, v_cache,
            _metadata(seqs, tables, range(num_decodes), num_decodes, block_size, device), scale, gen)))
    return results


def _check_store_kv(k, v, k_cache, v_cache, gen: torch.Generator) -> float:
    """Scattered slots with -1 padding interleaved: the written pool must equal index_copy's."""
    slots = torch.randperm(k_cache.shape[0] * k_cache.shape[1], generator=gen)[:k.shape[0]]
    slots[::5] = -1
    slots = slots.to(k.device)
    from engine.kernels.attention import store_kv  # imports triton: only once a check runs

    got_k, got_v = k_cache.clone(), v_cache.clone()
    store_kv(k, v, got_k, got_v, slots)
    real = slots >= 0
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_kv(k[real], v[real], want_k, want_v, slots[real])
    return max((got_k - want_k).abs().max().item(), (got_v - want_v).abs().max().item())


def _check_graph_replay(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                        gen: torch.Generator) -> float:
    """Capture a decode-only forward, refill its input tensors in place (new queries, shorter
    contexts, no KV writes) and replay: the result must equal an eager forward on those inputs."""
    backend = TritonAttentionBackend()
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    backend.forward(q, k, v, k_cache, v_cache, meta, scale)  # compile before capturing
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, k_cache, v_cache, meta, scale)
    q.copy_(torch.randn(q.shape, generator=gen).to(q))
    meta.slot_mapping.fill_(-1)
    shrink = torch.randint(0, 64, meta.context_lens.shape, generator=gen).to(meta.context_lens)
    meta.context_lens.copy_((meta.context_lens - shrink).clamp_(min=0))
    graph.replay()
    eager = backend.forward(q, k, v, k_cache, v_cache, meta, scale)
    torch.cuda.synchronize()
    return (out.float() - eager.float()).abs().max().item()


def _metadata(seqs: list[tuple[int, int]], tables: list[list[int]], keep: Sequence[int], num_decodes: int,
              block_size: int, device: torch.device) -> AttentionMetadata:
    slots, query_start, lens = [], [0], []
    for s in keep:
        ctx, new = seqs[s]
        slots += [tables[s][p // block_size] * block_size + p % block_size for p in range(ctx - new, ctx)] \
            if ctx else [-1]
        query_start.append(query_start[-1] + new)
        lens.append(ctx)
    width = max(len(tables[s]) for s in keep)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor([tables[s] + [0] * (width - len(tables[s])) for s in keep],
                                  dtype=torch.int64, device=device),
        context_lens=torch.tensor(lens, dtype=torch.int64, device=device),
        query_start=query_start, context_lens_host=lens,
        num_decodes=sum(1 for s in keep if s < num_decodes))


def _token_rows(seqs: list[tuple[int, int]], keep: list[int]) -> list[int]:
    starts = [0]
    for _, new in seqs:
        starts.append(starts[-1] + new)
    return [i for s in keep for i in range(starts[s], starts[s + 1])]
