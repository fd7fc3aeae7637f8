"""RMSNorm, optionally fused with the residual add before it: a Triton kernel (CUDA) and the torch
reference (what the CPU runs, and what the kernel is tested against).

Importing this module never imports triton: the CPU path needs only the reference, and triton
cannot launch without a GPU unless TRITON_INTERPRET=1. The kernel below is a plain function until
its first CUDA (or interpreted) call hands it to `triton.jit`, which reads TRITON_INTERPRET at that
moment; so a test may set the variable after this module was imported by the engine.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from engine.kernels.lazy_jit import jitted

_HAS_TRITON = importlib.util.find_spec("triton") is not None
tl: Any = None  # triton.language, bound on first use (the kernel source names it)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`norm(x) * weight` over the last dim; with `residual`: `(norm(x + residual), x + residual)`.
    The Triton kernel on CUDA, the torch reference elsewhere."""
    if x.is_cuda and _HAS_TRITON:
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)


def rms_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
        residual = x
    # Statistics in float32 whatever the activation dtype, as the reference models do.
    h = x.float()
    # The same operations as `weight * (h * rsqrt(mean(h^2) + eps)).to(x.dtype)`, bit for bit, but
    # in place on the temporaries: a third fewer allocations (a quarter of a 2048-token prefill
    # step's norm time on the CPU). `h * r` is a new tensor, so x (which h may be) is never written.
    inv = h.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    h = (h * inv).to(x.dtype)
    out = h.mul_(weight) if weight.dtype == h.dtype else weight * h
    return out if residual is None else (out, residual)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same results as rms_norm_torch, rounding included: the sum is rounded to x's dtype before
    the statistics, and the normalised value before the weight multiplies it.

    x may be [rows, n] or [tokens, heads, n] (q/k heads for Qwen3's qk-norm: a strided view of the
    fused qkv output), with a contiguous last dim; outputs are new contiguous tensors."""
    n = x.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    # Rows are (outer, inner) pairs so a [tokens, heads, n] view needs no copy; 2-D has inner 1.
    x3 = x if x.dim() == 3 else x.reshape(-1, 1, n)
    outer, inner = x3.shape[0], x3.shape[1]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"rms_norm: residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
        r3 = residual.contiguous().reshape(x3.shape)
        new_residual = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        r3, new_residual = x3, out  # unused by the kernel (HAS_RESIDUAL is off)
    if outer * inner == 0:
        return out if residual is None else (out, new_residual)
    block = max(16, 1 << (n - 1).bit_length())
    _kernels()[(outer * inner,)](
        x3, r3, weight, out, new_residual,
        inner, x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1),
        n, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(max(block // 256, 1), 8),
    )
    return out if residual is None else (out, new_residual)


def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr,
    inner, stride_x0, stride_x1, stride_r0, stride_r1,
    n, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    # One program per row; row = outer * inner + inner index. Outputs are contiguous rows of n.
    row = tl.program_id(0).to(tl.int64)
    i0 = row // inner
    i1 = row % inner
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + i0 * stride_x0 + i1 * stride_x1 + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + i0 * stride_r0 + i1 * stride_r1 + cols, mask=mask, other=0.0)
        # Rounded to the activation dtype, as torch's `x + residual` is, before the statistics.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n + cols, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / n
    h = (xf * tl.rsqrt(mean_sq + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (w * h).to(out_ptr.dtype.element_ty), mask=mask)


def _kernels() -> Any:
    return jitted(globals(), _rms_norm_kernel)
