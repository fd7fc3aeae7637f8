"""The reference attention backend: plain torch, exact, used on CPU and to check other backends."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        d = meta.num_decodes
        if d:
            out[:d] = _decode(q[:d], k_cache, v_cache, meta, scale)
        for s in range(d, meta.num_seqs):
            lo, hi = meta.query_start[s], meta.query_start[s + 1]
            ctx = meta.context_lens_host[s]
            if ctx == hi - lo:  # nothing earlier in the pool: attend to this chunk's own K/V
                ks, vs = k[lo:hi], v[lo:hi]
            else:
                ks, vs = _gather(k_cache, v_cache, meta.block_tables[s], ctx)
            out[lo:hi] = _causal(q[lo:hi], ks, vs, scale)
        return out


def write_kv(k, v, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Store each token's K/V at its slot of the flat pool view."""
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _gather(k_cache, v_cache, block_table: torch.Tensor, ctx: int):
    """The first `ctx` tokens of one sequence, contiguous: [ctx, kv_heads, head_dim] each."""
    block_size = k_cache.shape[1]
    blocks = block_table[: (ctx + block_size - 1) // block_size]
    ks = k_cache[blocks].flatten(0, 1)[:ctx]
    vs = v_cache[blocks].flatten(0, 1)[:ctx]
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


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """All single-token queries at once. Keys of the blocks every sequence shares are read once
    for the whole batch (cascade attention); only each sequence's own tail is gathered per row.
    Scores of both parts share one softmax, so the result is plain attention over the context."""
    d, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    shared = meta.num_shared_decode_blocks
    lens = meta.context_lens[:d] - shared * block_size
    tail_blocks = (max(meta.context_lens_host[:d]) - shared * block_size + block_size - 1) // block_size
    tables = meta.block_tables[:d, shared : shared + tail_blocks]
    qg = q.view(d, kv_heads, group, head_dim) * scale
    kt = k_cache[tables].flatten(1, 2)  # [d, tail, kv, head_dim]
    vt = v_cache[tables].flatten(1, 2)
    tail_scores = torch.einsum("dkgh,dlkh->dkgl", qg, kt)
    visible = torch.arange(kt.shape[1], device=q.device).unsqueeze(0) < lens.unsqueeze(1)
    tail_scores = tail_scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    if shared:
        # [kv, d * group, head_dim]: the queries of one KV head side by side (GQA without copies)
        qk = qg.permute(1, 0, 2, 3).reshape(kv_heads, d * group, head_dim)
        blocks = meta.block_tables[0, :shared]
        ks = k_cache[blocks].flatten(0, 1).permute(1, 2, 0)  # [kv, head_dim, shared tokens]
        vs = v_cache[blocks].flatten(0, 1).transpose(0, 1)  # [kv, shared tokens, head_dim]
        shared_scores = torch.bmm(qk, ks).view(kv_heads, d, group, -1).permute(1, 0, 2, 3)
        probs = torch.softmax(torch.cat((shared_scores, tail_scores), dim=-1), dim=-1,
                              dtype=torch.float32).to(q.dtype)
        p_shared, p_tail = probs.split([ks.shape[-1], kt.shape[1]], dim=-1)
        out = torch.bmm(p_shared.permute(1, 0, 2, 3).reshape(kv_heads, d * group, -1), vs)
        out = out.view(kv_heads, d, group, head_dim).permute(1, 0, 2, 3)
        out = out + torch.einsum("dkgl,dlkh->dkgh", p_tail, vt)
    else:
        probs = torch.softmax(tail_scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.einsum("dkgl,dlkh->dkgh", probs, vt)
    return out.reshape(d, heads, head_dim)
