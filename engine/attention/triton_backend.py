"""The CUDA attention backend: Triton kernels over the paged pool, same contract as the torch one.

Triton is imported lazily (on first forward), so this module imports anywhere; the kernels run on
CUDA, or on CPU tensors under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch

from engine.attention.base import AttentionBackend, AttentionMetadata
from engine.sampler import to_device


def _kernels() -> ModuleType:
    # Imported on first use, never at module import: importing it imports triton (see the docstring).
    # After the first call this is a sys.modules lookup.
    return importlib.import_module("engine.kernels.attention")


def triton_usable(device: torch.device) -> bool:
    """Whether the Triton kernels can run for `device`: CUDA, or anything under the interpreter."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


class TritonAttentionBackend(AttentionBackend):
    """Decodes go through the split-context decode kernel (CUDA-graph safe: device tensors and
    shapes only); prefill chunks through the extend kernel. Block sizes default to the H100/H200
    tuning; the keyword arguments override them (tests use tiny ones to exercise every loop)."""

    def __init__(self, decode_partition: int | None = None, decode_block_n: int | None = None,
                 prefill_block_m: int | None = None, prefill_block_n: int | None = None) -> None:
        self.decode_partition = decode_partition
        self.decode_block_n = decode_block_n
        self.prefill_block_m = prefill_block_m
        self.prefill_block_n = prefill_block_n
        # Every layer of a step gets the same metadata: its chunk layout goes to the device once.
        self._layout_meta: AttentionMetadata | None = None
        self._layout: tuple[torch.Tensor, int] | None = None

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        kern = _kernels()
        kern.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        d = meta.num_decodes
        if d:
            kern.decode_attention(q[:d], k_cache, v_cache, meta.block_tables[:d], meta.context_lens[:d],
                                  scale, out[:d], self.decode_partition, self.decode_block_n)
        # Decide on shapes, not host lists: a captured decode-only step never touches them.
        if q.shape[0] > d:
            query_start, max_query_len = self._chunk_layout(meta, q.device)
            kern.prefill_attention(q, k_cache, v_cache, meta.block_tables[d:], meta.context_lens[d:],
                                   query_start, max_query_len, scale, out,
                                   self.prefill_block_m, self.prefill_block_n)
        return out

    def _chunk_layout(self, meta: AttentionMetadata, device: torch.device) -> tuple[torch.Tensor, int]:
        """Device query_start of the prefill chunks (absolute rows of q) and the longest chunk."""
        if self._layout_meta is not meta or self._layout is None:
            starts = meta.query_start[meta.num_decodes:]
            longest = max(b - a for a, b in zip(starts, starts[1:], strict=False))
            # Through pinned memory, without waiting: torch.tensor(..., device="cuda") copies from
            # pageable memory and synchronises the host with the GPU on every prefill step.
            self._layout = to_device(torch.tensor(starts, dtype=torch.int64), device), longest
            self._layout_meta = meta  # held, so its id cannot be reused by a later step's meta
        return self._layout

