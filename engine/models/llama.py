"""The Llama-family decoder (Llama 2/3/3.1, Mistral, SmolLM2), with fused qkv and gate-up.

Qwen2 (qkv bias) and Qwen3 (per-head q/k norm) are the same network with a flag each, set from
ModelConfig; their modules only name the difference.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, TorchAttentionBackend
from engine.config import ModelConfig
from engine.kernels.activation import silu_and_mul
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.native import decode_ops


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = rotary
        self.scale = cfg.head_dim**-0.5

    def forward(self, positions, rope_rows, x, kv_cache, meta: AttentionMetadata,
                backend: AttentionBackend):
        qkv = self.qkv_proj(x)
        qk_size = self.q_size + self.kv_size
        if rope_rows is not None and self.q_norm is None:
            # The torch path (CPU): q and k heads sit side by side in qkv and rotate as one tensor.
            qk = qkv[:, :qk_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
            q, k = self.rotary.rotate_heads(qk, rope_rows).split([self.num_heads, self.num_kv_heads], 1)
            v = qkv[:, qk_size:].view(-1, self.num_kv_heads, self.head_dim)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(-1, self.num_heads, self.head_dim)
            k = k.view(-1, self.num_kv_heads, self.head_dim)
            v = v.view(-1, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary(positions, q, k, rope_rows)
        o = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(o.flatten(1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, rotary)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, rope_rows, x, residual, kv_cache, meta, backend):
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, rope_rows, x, kv_cache, meta, backend)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


# Hugging Face parameter names that we store fused: (our name, shard index).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """Flat tokens in ([num_tokens]), hidden states out; logits only for the rows asked for."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = rotary
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotary) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the LM head (again after to_empty(), which unties them)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        ops = self._native_decode_ops(input_ids, kv_caches, meta, backend)
        if ops is not None:
            return self._decode_native(ops, input_ids, positions, kv_caches, meta)
        x = self.embed_tokens(input_ids)
        residual = None
        rope_rows = self.rotary.rows(positions)  # once per step, for every layer
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(positions, rope_rows, x, residual, kv_cache, meta, backend)
        x, _ = self.norm(x, residual)
        return x

    def _native_decode_ops(self, input_ids, kv_caches, meta: AttentionMetadata,
                           backend: AttentionBackend) -> decode_ops.DecodeOps | None:
        """The native ops when this step can run on them: decodes only (prefill keeps the torch
        path, whose SDPA is faster on many rows), on the CPU, float32, with the torch backend (it
        owns the pool layout these ops read), no per-head q/k norm (Qwen3)."""
        if (input_ids.is_cuda or meta.num_decodes != meta.num_seqs or self.config.qk_norm
                or not isinstance(backend, TorchAttentionBackend)
                or kv_caches[0].dtype != torch.float32 or self.embed_tokens.weight.dtype != torch.float32):
            return None
        # The native ops index the RoPE tables and the pool unchecked: a step reaching past them
        # takes the torch path, which raises a clear error instead of reading stray memory.
        if (max(meta.context_lens_host) > self.rotary.cos.shape[0]
                or not decode_ops.fits_pool(meta, kv_caches[0].shape[1], kv_caches[0].shape[2])):
            return None
        return decode_ops.get()

    def _decode_native(self, ops: decode_ops.DecodeOps, input_ids, positions, kv_caches,
                       meta: AttentionMetadata) -> torch.Tensor:
        """The layers of a CPU decode step as a few native calls each (norm with the residual add,
        RoPE with the K/V write, attention over the pool, SiLU-and-mul) between the linears,
        which stay modules (quantized or not). The math of the module path; at batch 1 the module
        path's small torch ops cost more than the linears' reads of 4-bit weights."""
        cfg = self.config
        heads = cfg.num_heads
        cos, sin = self.rotary.cos, self.rotary.sin
        slots, tables, lens = meta.slot_mapping, meta.block_tables, meta.context_lens
        x = self.embed_tokens(input_ids)
        residual = None
        # The linears' forward is called, not the module: nn.Module.__call__ costs ~3 us a call
        # (hook checks), 4 calls a layer; inference registers no hooks on them.
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            attn, mlp, norm = layer.self_attn, layer.mlp, layer.input_layernorm
            h = ops.add_rms_norm(x, residual, norm.weight, norm.eps)
            if residual is None:  # the embedding output is this step's own tensor: added to in place
                residual = x
            qkv = attn.qkv_proj.forward(h)
            o = ops.rope_write_attend(qkv, positions, cos, sin, k_cache, v_cache, slots, tables, lens,
                                      heads, attn.scale)
            x = attn.o_proj.forward(o)
            norm = layer.post_attention_layernorm
            h = ops.add_rms_norm(x, residual, norm.weight, norm.eps)
            x = mlp.down_proj.forward(ops.silu_and_mul(mlp.gate_up_proj.forward(h)))
        return ops.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up. Every parameter row must
        be written, so a missing or misnamed tensor is an error, not silent random weights."""
        cfg = self.config
        params = dict(self.named_parameters())  # a tied lm_head is listed once, as embed_tokens
        q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
        shard_sizes = {"qkv_proj": [q, kv, kv], "gate_up_proj": [inter, inter]}
        rows_written = dict.fromkeys(params, 0)
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and cfg.tie_word_embeddings):
                continue
            start = 0
            for part, (fused, idx) in _FUSED.items():
                if f".{part}." in name:
                    name = name.replace(f".{part}.", f".{fused}.")
                    start = sum(shard_sizes[fused][:idx])
                    break
            target = params.get(name)
            if target is None:
                raise KeyError(f"weight {hf_name!r} has no place in the {cfg.family} model")
            dest = target.data[start : start + tensor.shape[0]]
            if dest.shape != tensor.shape:
                raise ValueError(f"weight {hf_name!r}: shape {tuple(tensor.shape)} does not fit "
                                 f"{name} {tuple(target.shape)}")
            dest.copy_(tensor)
            rows_written[name] += tensor.shape[0]
        missing = [n for n, rows in rows_written.items() if rows < params[n].shape[0]]
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:4]}")
