"""What every attention backend receives per step, and the interface it implements."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Where a step's tokens sit in the paged pool. Built once per step by the model runner.

    The batch is ordered decodes first (one query token each), then prefill chunks. Token i of the
    flat batch belongs to sequence s with query_start[s] <= i < query_start[s + 1]; that sequence
    then holds context_lens[s] tokens in the pool, this step's included.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: pool slot (block * block_size + offset) to write
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0
    context_lens: torch.Tensor  # [num_seqs] int64
    query_start: list[int]  # [num_seqs + 1], host side
    context_lens_host: list[int]  # same values as context_lens, host side
    num_decodes: int  # the first num_decodes sequences have exactly one query token
    # Leading blocks that every decode sequence shares (same physical blocks, from the prefix
    # cache: a common system prompt). Backends may read them once for all decodes.
    num_shared_decode_blocks: int = 0
    # Per sequence, the first block id when the blocks holding its context are consecutive ids
    # (-1 otherwise; empty: not computed). The torch backend then reads them as a view of the pool.
    block_run_starts: list[int] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_host)

    @functools.cached_property
    def index_extents(self) -> tuple[int, int, int, int]:
        """(lowest, highest) block id in the tables, then (lowest, highest) slot; (0, -1) for none.
        Once per step: every layer's check before native code indexes the pool reads it."""
        def extent(t: torch.Tensor) -> tuple[int, int]:
            return (int(t.min()), int(t.max())) if t.numel() else (0, -1)
        return (*extent(self.block_tables), *extent(self.slot_mapping))


class AttentionBackend(ABC):
    """Writes a layer's new K/V into the pool, then attends each query token to its context."""

    # Whether forward reads AttentionMetadata.block_run_starts: the runner computes them per step
    # only for a backend that does (the torch one), never on the Triton path's hot loop.
    reads_block_runs: bool = False

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...
