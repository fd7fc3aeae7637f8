"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer."""

from __future__ import annotations

import torch
from torch import nn

from engine.kernels.norm import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`norm(x)`; with `residual`, returns `(norm(x + residual), x + residual)`. The Triton
        kernel on CUDA, the torch reference on CPU (engine/kernels/norm.py)."""
        return rms_norm(x, self.weight, self.eps, residual)
