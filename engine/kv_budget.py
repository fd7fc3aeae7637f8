"""The KV budget: bytes of cache per token, the paged pool's size, and how many conversations of a
given length fit in it at once.

The model runner sizes its pool with `configured_pool_blocks` and reports it as a `KVBudget`, so
a plan made from the config alone (`plan`, no torch) and the pool the engine allocates are one
computation. On CUDA without `kv_cache_gib` the pool is what free GPU memory leaves after the
weights and the largest step, known only once the model is loaded: `plan` says None there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig, ModelConfig

DEFAULT_CPU_KV_GIB = 1.0
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def configured_pool_blocks(config: EngineConfig, device_type: str, block_bytes: int) -> int | None:
    """Blocks of a pool sized by the config: `kv_cache_gib`, or DEFAULT_CPU_KV_GIB on the CPU.
    None on CUDA without `kv_cache_gib` (sized from free GPU memory at load)."""
    gib = config.kv_cache_gib
    if gib is None and device_type == "cpu":
        gib = DEFAULT_CPU_KV_GIB
    if gib is None:
        return None
    return max(1, int(gib * 2**30) // block_bytes)


@dataclass(frozen=True)
class KVBudget:
    bytes_per_token: int  # 2 (K and V) x layers x KV heads x head dim x dtype bytes
    block_size: int  # tokens per block
    num_blocks: int | None  # None: sized at load from free GPU memory

    @property
    def block_bytes(self) -> int:
        return self.bytes_per_token * self.block_size

    @property
    def pool_tokens(self) -> int | None:
        return None if self.num_blocks is None else self.num_blocks * self.block_size

    @property
    def pool_bytes(self) -> int | None:
        return None if self.num_blocks is None else self.num_blocks * self.block_bytes

    def blocks_for(self, tokens: int) -> int:
        """Blocks one sequence of `tokens` tokens holds (its last block may be part full)."""
        return math.ceil(tokens / self.block_size)

    def conversations(self, context_tokens: int) -> int | None:
        """How many sequences of `context_tokens` fit in the pool together (prefix sharing aside:
        a system prompt cached once makes room for more)."""
        if self.num_blocks is None:
            return None
        return self.num_blocks // self.blocks_for(context_tokens)

    def overcommitted(self, max_num_seqs: int, context_tokens: int) -> bool:
        """Whether `max_num_seqs` sequences of `context_tokens` need more blocks than the pool
        has: then the scheduler preempts (and later recomputes) some of them."""
        fit = self.conversations(context_tokens)
        return fit is not None and fit < max_num_seqs

    def gib_for(self, sequences: int, context_tokens: int) -> float:
        """The kv_cache_gib that holds `sequences` sequences of `context_tokens`."""
        return sequences * self.blocks_for(context_tokens) * self.block_bytes / 2**30

    def stats(self) -> dict[str, Any]:
        """As LLMEngine.stats() states it (num_blocks is its `kv_blocks`)."""
        return {"kv_bytes_per_token": self.bytes_per_token, "kv_pool_tokens": self.pool_tokens}

    @classmethod
    def from_stats(cls, stats: dict[str, Any]) -> KVBudget | None:
        """The budget an engine's stats() states, or None where they do not say (a remote server
        that does not publish it)."""
        try:
            per_token, blocks = int(stats["kv_bytes_per_token"]), int(stats["kv_blocks"])
            tokens = int(stats["kv_pool_tokens"])
        except (KeyError, TypeError, ValueError):
            return None
        if per_token < 1 or blocks < 1 or tokens < blocks or tokens % blocks:
            return None
        return cls(per_token, tokens // blocks, blocks)


def plan(model: ModelConfig, config: EngineConfig, device_type: str) -> KVBudget:
    """The budget `config` gives `model` on a device of `device_type` ("cpu", "cuda"), computed as
    the model runner sizes its pool, without loading anything."""
    dtype_bytes = DTYPE_BYTES[config.dtype_name(device_type)]
    per_token = model.kv_bytes_per_token(dtype_bytes)
    blocks = configured_pool_blocks(config, device_type, per_token * config.block_size)
    return KVBudget(per_token, config.block_size, blocks)
