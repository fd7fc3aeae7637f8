"""The CPU decode step's non-linear ops (decode_ops.cpp) as functions on float32 tensors.

Each is one ctypes call where the torch path runs several small ops: at batch 1 a decode step of a
135M model spent more time in those ops' dispatch than in their arithmetic. `get()` gives None
(and the callers keep their torch path) when native kernels are off (OPENCLAW_CPU_KERNELS=0) or
no compiler is found. The ops take contiguous float32 CPU tensors and check what they rely on.
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import c_float, c_long, c_void_p

import torch

from engine.native import build

_SIGNATURES = {
    "add_rms_norm": (c_void_p, c_void_p, c_void_p, c_void_p, c_long, c_long, c_float),
    "rope_kv_write": (c_void_p, c_long, c_long, c_long, c_long, c_void_p, c_void_p, c_void_p,
                      c_void_p, c_void_p, c_void_p),
    "decode_attention": (c_void_p, c_long, c_void_p, c_void_p, c_void_p, c_long, c_void_p, c_long,
                         c_long, c_long, c_long, c_long, c_float, c_void_p),
    "rope_write_attend": (c_void_p, c_long, c_long, c_long, c_void_p, c_void_p, c_void_p, c_void_p,
                          c_void_p, c_void_p, c_void_p, c_long, c_void_p, c_long, c_long, c_float,
                          c_void_p),
    "silu_and_mul": (c_void_p, c_void_p, c_long, c_long),
}


class DecodeOps:
    """The library's functions with their argument types; see decode_ops.cpp for each one's math."""

    def __init__(self, library: ctypes.CDLL) -> None:
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(library, name)
            fn.argtypes, fn.restype = argtypes, None
        self._lib = library

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """`norm(x + residual) * weight`, with `residual` updated in place to `x + residual`; with
        residual None, `norm(x) * weight`. x: [rows, n]."""
        _check(x, weight, *(() if residual is None else (residual,)))
        if (x.dim() != 2 or weight.shape != x.shape[1:]
                or (residual is not None and residual.shape != x.shape)):
            raise ValueError(f"add_rms_norm: x {tuple(x.shape)}, weight {tuple(weight.shape)}, residual "
                             f"{None if residual is None else tuple(residual.shape)} do not fit")
        out = torch.empty_like(x)
        self._lib.add_rms_norm(x.data_ptr(), None if residual is None else residual.data_ptr(),
                               weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out

    def rope_kv_write(self, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slots: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> None:
        """Rotate the q and k heads of qkv [tokens, (heads + 2 kv_heads) * head_dim] in place at
        `positions` (tables [max_positions, head_dim / 2]) and store each token's k and v heads
        at its pool slot."""
        _check(qkv, cos, sin, k_cache, v_cache)
        _check_index(positions, slots)
        if qkv.shape[1] != (heads + 2 * kv_heads) * head_dim or cos.shape[1] * 2 != head_dim:
            raise ValueError(f"rope_kv_write: qkv {tuple(qkv.shape)} or tables {tuple(cos.shape)} "
                             f"do not fit {heads}+2x{kv_heads} heads of {head_dim}")
        self._lib.rope_kv_write(qkv.data_ptr(), qkv.shape[0], heads, kv_heads, head_dim,
                                positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr())

    def decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         block_tables: torch.Tensor, context_lens: torch.Tensor, heads: int,
                         scale: float) -> torch.Tensor:
        """One query token per sequence over its context in the paged pool. q: [seqs, >= heads *
        head_dim] rows or [seqs, heads, head_dim] (views of the fused qkv output are fine: the
        rows' stride is read, the heads must be adjacent);
        caches [blocks, block_size, kv_heads, head_dim]. Returns [seqs, heads * head_dim]."""
        _check(k_cache, v_cache)
        _check_index(block_tables, context_lens)
        _, block_size, kv_heads, head_dim = k_cache.shape
        seqs = q.shape[0]
        row = q.shape[1] * q.shape[2] if q.dim() == 3 else q.shape[-1]
        if (q.dtype is not torch.float32 or not q.is_cpu or q.stride(-1) != 1
                or (q.dim() == 3 and q.stride(1) != head_dim) or row < heads * head_dim
                or heads % kv_heads):
            raise ValueError(f"decode_attention: q {tuple(q.shape)} does not hold {heads} float32 "
                             f"heads of {head_dim} in contiguous rows")
        if len(context_lens) != seqs or block_tables.shape[0] != seqs:
            raise ValueError("decode_attention: one block table and context length per query row")
        out = torch.empty(seqs, heads * head_dim)
        self._lib.decode_attention(q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                   block_tables.data_ptr(), block_tables.shape[1],
                                   context_lens.data_ptr(), seqs, heads, kv_heads, head_dim,
                                   block_size, scale, out.data_ptr())
        return out

    def rope_write_attend(self, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slots: torch.Tensor, block_tables: torch.Tensor,
                          context_lens: torch.Tensor, heads: int, scale: float) -> torch.Tensor:
        """rope_kv_write then decode_attention on q in qkv's rows, in one call: a decode step's
        attention from the fused qkv output (one token per sequence). Returns [seqs, heads *
        head_dim]."""
        _check(qkv, cos, sin, k_cache, v_cache)
        _check_index(positions, slots, block_tables, context_lens)
        _, block_size, kv_heads, head_dim = k_cache.shape
        seqs = qkv.shape[0]
        if (qkv.shape[1] != (heads + 2 * kv_heads) * head_dim or cos.shape[1] * 2 != head_dim
                or heads % kv_heads or len(context_lens) != seqs or block_tables.shape[0] != seqs
                or len(positions) != seqs or len(slots) != seqs):
            raise ValueError(f"rope_write_attend: qkv {tuple(qkv.shape)}, tables {tuple(cos.shape)} "
                             f"or {len(context_lens)} sequences do not fit {heads}+2x{kv_heads} "
                             f"heads of {head_dim}, one token a sequence")
        out = torch.empty(seqs, heads * head_dim)
        self._lib.rope_write_attend(qkv.data_ptr(), heads, kv_heads, head_dim, positions.data_ptr(),
                                    cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
                                    v_cache.data_ptr(), slots.data_ptr(), block_tables.data_ptr(),
                                    block_tables.shape[1], context_lens.data_ptr(), seqs, block_size,
                                    scale, out.data_ptr())
        return out

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """`silu(gate) * up` of x [rows, 2 * inter] (gate then up)."""
        _check(x)
        if x.dim() != 2 or x.shape[1] % 2:
            raise ValueError(f"silu_and_mul: x {tuple(x.shape)} is not [rows, 2 * inter]")
        inter = x.shape[1] // 2
        out = torch.empty(x.shape[0], inter)
        self._lib.silu_and_mul(x.data_ptr(), out.data_ptr(), x.shape[0], inter)
        return out


# The checks run on every call of a decode step (~150 a step): `is_cpu` and `is`, not
# `device.type` and `==`, which cost ~2 us each.
def _check(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype is not torch.float32 or not t.is_cpu or not t.is_contiguous():
            raise ValueError(f"native decode ops take contiguous float32 CPU tensors, got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device} (contiguous: {t.is_contiguous()})")


def _check_index(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype is not torch.int64 or not t.is_cpu or not t.is_contiguous():
            raise ValueError(f"native decode ops take contiguous int64 CPU indices, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")


def fits_pool(meta, blocks: int, block_size: int) -> bool:
    """Whether a step's block ids, slots and context lengths stay inside a pool of `blocks` blocks
    of `block_size` tokens: the native ops index the pool unchecked, so a step that does not is
    left to the torch path, which raises a clear error instead of reading stray memory."""
    low_block, high_block, low_slot, high_slot = meta.index_extents
    return (low_block >= 0 and high_block < blocks and low_slot >= 0
            and high_slot < blocks * block_size
            and max(meta.context_lens_host, default=0) <= meta.block_tables.shape[1] * block_size)


@functools.cache
def get() -> DecodeOps | None:
    """The ops, built on first use; None when native kernels are off or cannot be built."""
    library = build.load("decode_ops")
    return None if library is None else DecodeOps(library)
