"""The reference attention backend: plain torch, exact, used on CPU and to check other backends."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionMetadata
from engine.native import decode_ops


class TorchAttentionBackend(AttentionBackend):
    reads_block_runs = True

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        d = meta.num_decodes
        if d == meta.num_seqs:  # a decode-only step: its output needs no placing among prefills
            cpu32 = q.device.type == "cpu" and q.dtype == k_cache.dtype == torch.float32
            # Blocks past the pool: the torch path, which raises (the native op reads unchecked).
            in_pool = cpu32 and decode_ops.fits_pool(meta, k_cache.shape[0], k_cache.shape[1])
            ops = decode_ops.get() if in_pool else None
            if ops is not None:  # one call over the pool, no gathers
                out = ops.decode_attention(q, k_cache, v_cache, meta.block_tables,
                                           meta.context_lens, q.shape[1], scale)
                return out.view(q.shape)
            return _decode(q, k_cache, v_cache, meta, scale)
        out = torch.empty_like(q)
        if d:
            out[:d] = _decode(q[:d], k_cache, v_cache, meta, scale)
        for s in range(d, meta.num_seqs):
            lo, hi = meta.query_start[s], meta.query_start[s + 1]
            ctx = meta.context_lens_host[s]
            if ctx == hi - lo:  # nothing earlier in the pool: attend to this chunk's own K/V
                ks, vs = k[lo:hi], v[lo:hi]
            else:
                ks, vs = _gather(k_cache, v_cache, meta.block_tables[s], ctx, _run_start(meta, s))
            out[lo:hi] = _causal(q[lo:hi], ks, vs, scale)
        return out


def write_kv(k, v, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Store each token's K/V at its slot of the flat pool view."""
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _run_start(meta: AttentionMetadata, s: int) -> int:
    """Sequence s's first block when its context blocks are consecutive in the pool, else -1."""
    return meta.block_run_starts[s] if meta.block_run_starts else -1


def _gather(k_cache, v_cache, block_table: torch.Tensor, ctx: int, run_start: int = -1):
    """The first `ctx` tokens of one sequence, contiguous: [ctx, kv_heads, head_dim] each. Blocks
    that are consecutive in the pool (`run_start` >= 0) are a view of it: the same values in the
    same layout as the gathered copy, so the attention over them has the same bits."""
    block_size = k_cache.shape[1]
    n = (ctx + block_size - 1) // block_size
    if run_start >= 0:
        return (k_cache[run_start : run_start + n].flatten(0, 1)[:ctx],
                v_cache[run_start : run_start + n].flatten(0, 1)[:ctx])
    blocks = block_table[:n]
    # index_select on the block dim copies whole blocks; advanced indexing is ~3x slower on CPU
    ks = k_cache.index_select(0, blocks).flatten(0, 1)[:ctx]
    vs = v_cache.index_select(0, blocks).flatten(0, 1)[:ctx]
    return ks, vs


def _causal(q, k, v, scale: float) -> torch.Tensor:
    """Queries are the last q_len of the k_len positions (bottom-right aligned causal mask)."""
    q_len, k_len = q.shape[0], k.shape[0]
    # 4-D [1, heads, len, dim]: with 3-D inputs torch's CPU SDPA falls back to its slow math path.
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if q_len == k_len:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        rows = torch.arange(k_len - q_len, k_len, device=q.device).unsqueeze(1)
        mask = torch.arange(k_len, device=q.device).unsqueeze(0) <= rows
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def _attend(q, k, v, mask: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [b, h, rows, dim] over k, v [b, h, keys, dim] (any strides), with an
    additive mask; returns the output and the log-sum-exp of each row's scaled scores (float32),
    so that attentions over disjoint key sets can be merged exactly. On the CPU that is torch's
    flash kernel (what SDPA runs, but SDPA drops the log-sum-exp); plain math elsewhere (this
    backend is also the reference the Triton kernels are checked against on CUDA)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    lse = scores.logsumexp(-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.float()).to(q.dtype)
    return out, lse


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """All single-token queries at once. Keys of the blocks every sequence shares are read once
    for the whole batch (cascade attention); only each sequence's own tail is gathered per row.
    The two parts are attended separately and merged by their log-sum-exp, so the result is
    plain attention over the whole context.

    Measured on the CPU bench's shapes (2 cores; 16 decodes, 400 shared + 60-270 own tokens; one
    layer): 4.4 ms with one softmax over concatenated einsum scores, 1.4 ms like this. The time
    went to `k_cache[tables]` (advanced indexing: 3x slower than `index_select` on the block dim)
    and to the einsums, which copied the gathered K/V once more into their bmm layout; the flash
    kernel reads the gathered view as it is ([d, kv_heads, tail, head_dim], strided)."""
    d, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    shared = meta.num_shared_decode_blocks
    lens_host = [c - shared * block_size for c in meta.context_lens_host[:d]]
    longest = max(lens_host)
    # GQA without copies: the `group` query heads of one KV head are that head's query rows.
    qg = q.view(d, kv_heads, group, head_dim)
    if longest:
        tail_blocks = (longest + block_size - 1) // block_size
        first = _run_start(meta, 0) if d == 1 and not shared else -1
        if first >= 0:  # one sequence on consecutive blocks: a view, not a copy of its context
            kt, vt = k_cache[first : first + tail_blocks], v_cache[first : first + tail_blocks]
        else:
            tables = meta.block_tables[:d, shared : shared + tail_blocks].flatten()
            kt, vt = k_cache.index_select(0, tables), v_cache.index_select(0, tables)
        kt = kt.view(d, -1, kv_heads, head_dim)[:, :longest].transpose(1, 2)
        vt = vt.view(d, -1, kv_heads, head_dim)[:, :longest].transpose(1, 2)
        mask = None
        if min(lens_host) != longest:  # ragged tails: hide each row's keys past its own length
            lens = meta.context_lens[:d] - shared * block_size
            past = torch.arange(longest, device=q.device) >= lens.unsqueeze(1)
            mask = torch.zeros(d, 1, 1, longest, dtype=q.dtype, device=q.device)
            mask.masked_fill_(past[:, None, None, :], float("-inf"))
        out, lse = _attend(qg, kt, vt, mask, scale)
        if not shared:
            return out.reshape(d, heads, head_dim)
    # The shared blocks: all d * group query rows of a KV head against them in one call.
    blocks = meta.block_tables[0, :shared]
    ks = k_cache.index_select(0, blocks).flatten(0, 1).transpose(0, 1)[None]  # [1, kv, tokens, dim]
    vs = v_cache.index_select(0, blocks).flatten(0, 1).transpose(0, 1)[None]
    qs = qg.transpose(0, 1).reshape(1, kv_heads, d * group, head_dim)
    out_s, lse_s = _attend(qs, ks, vs, None, scale)
    out_s = out_s.view(kv_heads, d, group, head_dim).transpose(0, 1)
    if not longest:  # every row's context is the shared blocks alone
        return out_s.reshape(d, heads, head_dim)
    lse_s = lse_s.view(kv_heads, d, group).transpose(0, 1)
    if min(lens_host) == 0:  # a row with no keys of its own: only its shared part counts
        empty = torch.tensor([n == 0 for n in lens_host], device=q.device)[:, None, None]
        out, lse = out.masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, float("-inf"))
    # Softmax over both parts = each part's softmax weighted by its share of the total mass:
    # exp(lse_s) / (exp(lse_s) + exp(lse)) = sigmoid(lse_s - lse). Merged in float32.
    weight = torch.sigmoid(lse_s - lse).unsqueeze(-1)
    return torch.lerp(out.float(), out_s.float(), weight).to(q.dtype).reshape(d, heads, head_dim)
