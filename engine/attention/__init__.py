"""Attention over the paged KV pool, behind one interface: a torch reference (CPU) and, later, Triton."""

from __future__ import annotations

import torch

from engine.attention.base import AttentionBackend, AttentionMetadata
from engine.attention.torch_ref import TorchAttentionBackend


def get_backend(device: torch.device) -> AttentionBackend:
    """The backend for `device`. CUDA gets the Triton kernels when the GPU issue adds them."""
    return TorchAttentionBackend()


__all__ = ["AttentionBackend", "AttentionMetadata", "TorchAttentionBackend", "get_backend"]
