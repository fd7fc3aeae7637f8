"""Attention over the paged KV pool, behind one interface: a torch reference (CPU) and Triton (CUDA)."""

from __future__ import annotations

import os

import torch

from engine.attention.base import AttentionBackend, AttentionMetadata
from engine.attention.torch_ref import TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend, triton_usable

_ENV = "OPENCLAW_ATTENTION"  # "torch" or "triton"; unset: Triton on CUDA when it imports, else torch


def get_backend(device: torch.device) -> AttentionBackend:
    """The backend for `device`: the Triton kernels on CUDA when triton imports, the torch reference
    otherwise. OPENCLAW_ATTENTION=torch|triton forces one (triton on CPU needs TRITON_INTERPRET=1)."""
    choice = os.environ.get(_ENV, "").strip().lower()
    if choice not in ("", "torch", "triton"):
        raise ValueError(f"{_ENV}={choice!r} is not a backend; use 'torch' or 'triton', or unset it")
    if choice == "torch":
        return TorchAttentionBackend()
    if choice == "triton":
        if not triton_usable(device):
            raise RuntimeError(
                f"{_ENV}=triton but Triton cannot run on {device}: install triton (pip install "
                "'openclaw-py[gpu]') and use a CUDA device, or set TRITON_INTERPRET=1 for CPU tests")
        return TritonAttentionBackend()
    if device.type == "cuda" and triton_usable(device):
        return TritonAttentionBackend()
    return TorchAttentionBackend()


__all__ = ["AttentionBackend", "AttentionMetadata", "TorchAttentionBackend", "TritonAttentionBackend",
           "get_backend"]
