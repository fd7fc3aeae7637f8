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
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if q_len == k_len:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        rows = torch.arange(k_len - q_len, k_len, device=q.device).unsqueeze(1)
        mask = torch.arange(k_len, device=q.device).unsqueeze(0) <= rows
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return o.transpose(0, 1)


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """All single-token queries at once over their padded block tables, with a length mask."""
    d = q.shape[0]
    block_size = k_cache.shape[1]
    max_ctx = max(meta.context_lens_host[:d])
    tables = meta.block_tables[:d, : (max_ctx + block_size - 1) // block_size]
    ks = k_cache[tables].flatten(1, 2)  # [d, blocks * block_size, kv_heads, head_dim]
    vs = v_cache[tables].flatten(1, 2)
    positions = torch.arange(ks.shape[1], device=q.device)
    mask = (positions.unsqueeze(0) < meta.context_lens[:d].unsqueeze(1))[:, None, None, :]
    o = F.scaled_dot_product_attention(
        q.unsqueeze(2), ks.transpose(1, 2), vs.transpose(1, 2), attn_mask=mask, scale=scale,
        enable_gqa=True,
    )
    return o.squeeze(2)
