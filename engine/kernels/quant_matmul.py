"""Weight-only quantized matmuls for CUDA: `x @ w.T (+ bias)` where w is int8 per channel or int4
group-wise in the canonical layout of engine/layers/quant.py, read packed as it is (no dequantized
copy), activations fp16/bf16/fp32, fp32 accumulation, output in x's dtype.

Importing this module never imports triton (see engine/kernels/norm.py for why and how).

The weight never leaves its integer form before the dot, and the scales are applied to the dot's
fp32 result: integers up to 127 are exact in fp16 and bf16, so the tensor cores multiply exactly
and the only rounding left is the fp32 accumulation, the same math as dequantize-then-fp32-matmul.
  int8: y[m, o] = scale[o] * sum_i x[m, i] q[o, i]
  int4: y[m, o] = sum_g (scale[o, g] * sum_{i in g} x[m, i] q[o, i] + offset[o, g] * sum_{i in g} x[m, i])
so int4 steps through K one group at a time (BLOCK_K = group).

Two tilings (choose_tiles). Decode (1-16 rows, memory-bound: the weight is the traffic) takes all
rows in one 16-row tile, the smallest tl.dot takes, so every weight byte is read once, and splits K
across programs so that a narrow layer still fills the GPU (about two programs per SM); the fp32
partials are summed by a small reduce kernel (deterministic, unlike atomics). Prefill (more rows,
compute-bound) takes 32-128 x 128 tiles over all of K, ordered so consecutive programs share a
weight tile in L2.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import torch

from engine.kernels.lazy_jit import jitted

_HAS_TRITON = importlib.util.find_spec("triton") is not None
tl: Any = None  # triton.language, bound on first use (the kernel sources name it)

DECODE_ROWS = 16  # up to this many rows: one row tile, split K (tl.dot's smallest M is 16)
_DEFAULT_SMS = 132  # an H100 SXM's, for the split when no device can be asked (the interpreter)
_PROGRAMS_PER_SM = 2
_MIN_K_BLOCKS_PER_SPLIT = 2  # a split streams at least this many K tiles: launch and reduce amortised
_MAX_SPLIT = 16  # the reduce reads split_k fp32 partials per output: keep that traffic small


@dataclass(frozen=True)
class Tiles:
    """One launch's tiling: block sizes, the K split (1: no reduce), and the launch options."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


def choose_tiles(rows: int, out_features: int, in_features: int, group: int | None = None,
                 sms: int = _DEFAULT_SMS, x_bytes: int = 2) -> Tiles:
    """The tiling for a (rows, in) x (out, in)^T product; group None is int8, else int4's group.

    Decode: BLOCK_N 64 weight rows x BLOCK_K (128 int8 columns or one int4 group of 32-128) is 4-8
    KiB per step, enough in flight per program with 3-4 stages to stream at full bandwidth. Prefill:
    128-wide tiles with BLOCK_M grown to the rows (32/64/128), the shapes Triton's own fp16 GEMMs
    run well; 8 warps once the tile is 128 x 128. fp32 activations (x_bytes 4) stop at BLOCK_M 64:
    a 128 x 128 fp32 x tile in 3 stages would want 208 KiB of shared memory, more than an A100 has."""
    if group is None:
        block_k = min(128 if rows <= DECODE_ROWS else 64, max(16, _next_pow2(in_features)))
    else:
        block_k = group
    k_blocks = -(-in_features // block_k)
    if rows <= DECODE_ROWS:
        block_n = 64
        n_tiles = -(-out_features // block_n)
        split = -(-_PROGRAMS_PER_SM * sms // n_tiles)
        split = max(1, min(split, _MAX_SPLIT, k_blocks // _MIN_K_BLOCKS_PER_SPLIT))
        split = -(-k_blocks // -(-k_blocks // split))  # no split left without a K tile
        return Tiles(DECODE_ROWS, block_n, block_k, split, num_warps=4, num_stages=4)
    block_m = 32 if rows <= 32 else 64 if rows <= 64 or x_bytes > 2 else 128
    return Tiles(block_m, 128, block_k, 1, num_warps=8 if block_m == 128 else 4, num_stages=3)


def int8_weight_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None = None, *, tiles: Tiles | None = None) -> torch.Tensor:
    """x (rows, in) fp16/bf16/fp32 @ (qweight int8 (out, in) * scale fp32 (out,)[:, None]).T + bias,
    as (rows, out) in x's dtype. `tiles` overrides choose_tiles (tests use it to force a tiling)."""
    out_f, in_f = _check_weight("int8_weight_matmul", x, qweight, torch.int8, 1)
    _check_scales("int8_weight_matmul", "scale", scale, (out_f,))
    return _launch(x, qweight, scale, None, None, bias, out_f, in_f, tiles)


def int4_weight_matmul(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                       group: int, bias: torch.Tensor | None = None, *, tiles: Tiles | None = None,
                       ) -> torch.Tensor:
    """x (rows, in) @ w.T + bias with w[o, i] = q[o, i] * scale[o, i // group] + offset[o, i // group],
    q the nibbles of qweight uint8 (out, in // 2) (column 2j low, 2j + 1 high); (rows, out) in x's
    dtype. group: a power of two from 16 to 256 dividing in (32 and 128 are what the loader makes)."""
    out_f, in_f = _check_weight("int4_weight_matmul", x, qweight, torch.uint8, 2)
    if group not in (16, 32, 64, 128, 256) or in_f % group:
        raise ValueError(f"int4_weight_matmul: group {group} must be a power of two from 16 to 256 "
                         f"dividing in_features {in_f}")
    for name, t in (("scale", scale), ("offset", offset)):
        _check_scales("int4_weight_matmul", name, t, (out_f, in_f // group))
    return _launch(x, qweight, scale, offset, group, bias, out_f, in_f, tiles)


def _launch(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
            group: int | None, bias: torch.Tensor | None, out_f: int, in_f: int,
            tiles: Tiles | None) -> torch.Tensor:
    lead = x.shape[:-1]
    x2 = x.reshape(-1, in_f)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    if bias is not None and (bias.shape != (out_f,) or bias.device != x.device):
        raise ValueError(f"weight matmul: bias {tuple(bias.shape)} on {bias.device} must be ({out_f},) "
                         f"on {x.device}")
    out = torch.empty(rows, out_f, dtype=x.dtype, device=x.device)
    if rows == 0 or out_f == 0:
        return out.reshape(*lead, out_f)
    t = tiles or choose_tiles(rows, out_f, in_f, group, _sm_count(x.device), x.element_size())
    if group is not None and t.block_k != group:
        raise ValueError(f"int4_weight_matmul: tiles.block_k {t.block_k} must equal the group {group}")
    grid = (-(-rows // t.block_m), -(-out_f // t.block_n), t.split_k)
    k_blocks = -(-in_f // t.block_k)
    partial = t.split_k > 1
    dest = torch.empty(t.split_k, rows, out_f, dtype=torch.float32, device=x.device) if partial else out
    bias_arg = bias if bias is not None else out  # never read: HAS_BIAS is off
    jitted(globals(), _weight_matmul_kernel)[grid](
        x2, qweight, scale, offset if offset is not None else scale, bias_arg, dest,
        rows, out_f, in_f, -(-k_blocks // t.split_k), x2.stride(0), qweight.stride(0),
        scale.stride(0) if scale.dim() == 2 else 0,
        INT4=group is not None, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, PARTIAL=partial,
        HAS_BIAS=bias is not None and not partial, IEEE=x.dtype == torch.float32,
        num_warps=t.num_warps, num_stages=t.num_stages)
    if partial:
        block = min(1024, _next_pow2(out_f))
        jitted(globals(), _reduce_kernel)[(rows, -(-out_f // block))](
            dest, bias_arg, out, rows, out_f, SPLIT_K=t.split_k, HAS_BIAS=bias is not None, BLOCK=block,
            num_warps=4)
    return out.reshape(*lead, out_f)


def _check_weight(fn: str, x: torch.Tensor, qweight: torch.Tensor, qdtype: torch.dtype,
                  per_byte: int) -> tuple[int, int]:
    """(out, in) of a valid call; a ValueError naming what is wrong otherwise."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"{fn}: x is {x.dtype}; it must be float16, bfloat16 or float32")
    if qweight.dtype != qdtype or qweight.dim() != 2 or qweight.stride(-1) != 1:
        raise ValueError(f"{fn}: qweight must be a row-major 2-D {qdtype} tensor, got {qweight.dtype} "
                         f"{tuple(qweight.shape)}")
    out_f, in_f = qweight.shape[0], qweight.shape[1] * per_byte
    if x.dim() < 1 or x.shape[-1] != in_f:
        raise ValueError(f"{fn}: x {tuple(x.shape)} does not match the weight's in_features {in_f}")
    if x.device != qweight.device:
        raise ValueError(f"{fn}: x is on {x.device}, qweight on {qweight.device}")
    _check_device(fn, x)
    return out_f, in_f


def _check_device(fn: str, x: torch.Tensor) -> None:
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise ValueError(f"{fn}: x is on {x.device}; this Triton kernel runs on CUDA (or under "
                         "TRITON_INTERPRET=1); the CPU path dequantizes with engine.layers.quant")
    if not _HAS_TRITON:
        raise RuntimeError(f"{fn}: triton is not installed (pip install 'openclaw-py[gpu]')")


def _check_scales(fn: str, name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if t.dtype != torch.float32 or tuple(t.shape) != shape or t.stride(-1) != 1:
        raise ValueError(f"{fn}: {name} must be a row-major float32 tensor of shape {shape} (the "
                         f"canonical layout), got {t.dtype} {tuple(t.shape)}")


@functools.cache
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_SMS
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _weight_matmul_kernel(
    x_ptr, q_ptr, s_ptr, o_ptr, b_ptr, out_ptr,
    rows, n, k, k_blocks_per_split, stride_xm, stride_qn, stride_sn,
    INT4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
):
    # Grid (row tiles, column tiles, K splits); split s covers K tiles [s * per, (s + 1) * per).
    # int4: BLOCK_K is the group, so each K tile is one group, scaled right after its dot.
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < rows, offs_n < n
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * stride_qn
    s_rows = offs_n.to(tl.int64) * stride_sn
    kb_start = tl.program_id(2) * k_blocks_per_split
    kb_end = tl.minimum(kb_start + k_blocks_per_split, tl.cdiv(k, BLOCK_K))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        cols = kb * BLOCK_K + offs_k
        k_mask = cols < k  # int8's last tile; int4's K is a multiple of its tiles
        a = tl.load(x_rows + cols[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        if INT4:
            packed = tl.load(q_rows + (kb * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2))[None, :],
                             mask=n_mask[:, None], other=0)
            q = tl.interleave(packed & 0xF, packed >> 4)  # column 2j from the low nibble, 2j + 1 high
        else:
            q = tl.load(q_rows + cols[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
        w = tl.trans(q.to(a.dtype))  # exact: int4 0..15 and int8 |q| <= 127 fit fp16's and bf16's significand
        if IEEE:  # fp32 activations: a true fp32 dot, not TF32's 10-bit inputs
            part = tl.dot(a, w, input_precision="ieee")
        else:
            part = tl.dot(a, w)
        if INT4:
            s = tl.load(s_ptr + s_rows + kb, mask=n_mask, other=0.0)
            o = tl.load(o_ptr + s_rows + kb, mask=n_mask, other=0.0)
            acc += part * s[None, :] + tl.sum(a.to(tl.float32), axis=1)[:, None] * o[None, :]
        else:
            acc += part
    if not INT4:
        acc *= tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    # The output tile: this split's fp32 partials into [split, rows, n], or bias + cast into out.
    mask = m_mask[:, None] & n_mask[None, :]
    offs = offs_m.to(tl.int64)[:, None] * n + offs_n[None, :]
    if PARTIAL:
        tl.store(out_ptr + tl.program_id(2).to(tl.int64) * rows * n + offs, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _reduce_kernel(part_ptr, b_ptr, out_ptr, rows, n, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK: tl.constexpr):
    # Grid (rows, column blocks): out[m, cols] = sum over splits of part[s, m, cols] (+ bias).
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (s * rows + m) * n + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * n + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)
