"""Rotary position embeddings (the "rotate half" layout) with Llama 3 and linear scaling."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from engine.kernels.rope import apply_rope, rope_rows, rotate_heads


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, freq_factors: torch.Tensor | None
) -> torch.Tensor:
    """Per-pair inverse frequencies, float32 [head_dim // 2]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if freq_factors is not None:  # GGUF `rope_freqs`: Llama 3.1 scaling baked into the file
        return (inv_freq / freq_factors.to(torch.float64)).float()
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind == "default":
        pass
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    else:
        raise ValueError(
            f"rope scaling type {kind!r} is not supported (supported: default, linear, llama3)"
        )
    return inv_freq.float()


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k at arbitrary (flat, per-token) positions from a cos/sin table.

    The tables are plain attributes, not buffers, so casting or re-materialising the model's
    weights leaves them alone: they stay float32, as the reference models compute them.
    """

    def __init__(self, max_positions: int, inv_freq: torch.Tensor, device: torch.device) -> None:
        super().__init__()
        positions = torch.arange(max_positions, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, inv_freq.to(device))
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The torch path's table rows at `positions`, which the model looks up once per step for
        all its layers (they rotate at the same positions); None on CUDA, where the kernel reads
        the tables itself."""
        return None if positions.is_cuda else rope_rows(positions, self.cos, self.sin)

    def rotate_heads(self, x: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The torch path for q and k heads as one tensor [N, heads + kv_heads, head_dim] (adjacent
        in the fused qkv output): half the small kernels of forward, the same bits."""
        return rotate_heads(x, rows)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [N, heads, head_dim], k: [N, kv_heads, head_dim], positions: [N]; `rows`: what
        rows(positions) gave. On CUDA the Triton kernel rotates q and k in place; the CPU gets new
        tensors (engine/kernels/rope.py)."""
        return apply_rope(positions, q, k, self.cos, self.sin, rows)
