"""Torch-facing side of gemv.cpp: weight-only int4/int8 matmuls of fp32 activations on the CPU.

`kernels()` is the loaded library, or None (no compiler, OPENCLAW_CPU_KERNELS=0, or its probe
disagreed with the torch reference): the caller then keeps its torch path. int4 weights are
repacked once (`repack_int4`) from engine/layers/quant.py's layout into the kernel's: per chunk of
32 columns, byte j holds column j (low nibble) and column j + 16 (high nibble)."""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from engine.layers.quant import dequantize_int4, dequantize_int8, pack_int4, unpack_int4
from engine.native.build import address, load

log = logging.getLogger(__name__)

_P, _L = ctypes.c_void_p, ctypes.c_long


def declare(lib: ctypes.CDLL) -> None:
    """Sets the argument and result types of the library's functions."""
    lib.gemv_vectorized.argtypes, lib.gemv_vectorized.restype = (), ctypes.c_int
    lib.gemv_q8_vectorized.argtypes, lib.gemv_q8_vectorized.restype = (), ctypes.c_int
    lib.int4_linear.argtypes = (_P, _L, _L, _P, _P, _P, _L, _L, _P, _P)
    lib.int4_linear_q8.argtypes = (_P, _L, _L, _P, _P, _P, _L, _P, _P)
    lib.int8_linear.argtypes = (_P, _L, _L, _P, _P, _L, _P, _P)
    lib.int4_dequantize.argtypes = (_P, _P, _P, _L, _L, _L, _P)
    lib.int8_dequantize.argtypes = (_P, _P, _L, _L, _P)
    for fn in (lib.int4_linear, lib.int4_linear_q8, lib.int8_linear, lib.int4_dequantize,
               lib.int8_dequantize):
        fn.restype = None


def repack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """engine/layers/quant.py's packed nibbles (out, in // 2) -> the kernel's (out, in // 2)."""
    q = unpack_int4(qweight)
    out, cols = q.shape
    chunks = q.view(out, cols // 32, 2, 16)  # [..., 0, j] column j, [..., 1, j] column j + 16
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(out, cols // 2).contiguous()


def canonical_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `repack_int4`: back to engine/layers/quant.py's layout."""
    out, half = packed.shape
    chunks = packed.view(out, half // 16, 16)
    q = torch.stack((chunks & 0x0F, chunks >> 4), dim=2).reshape(out, half * 2)
    return pack_int4(q)


def _out(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.empty(x.shape[0], n, dtype=torch.float32)


def int4_linear(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                offset: torch.Tensor, group: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x (rows, in) fp32 contiguous @ the int4 weight.T (+ bias): (rows, out) fp32."""
    n, k = packed.shape[0], packed.shape[1] * 2
    y = _out(x, n)
    lib.int4_linear(address(x), x.shape[0], k, address(packed), address(scale), address(offset), n,
                    group, None if bias is None else address(bias), address(y))
    return y


def int4_linear_q8(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                   offset: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """As `int4_linear` (groups of 32 only) with x rounded to int8 per chunk of 32 columns
    (its own scale, amax / 127) and integer dot products: faster, not exact."""
    n, k = packed.shape[0], packed.shape[1] * 2
    y = _out(x, n)
    lib.int4_linear_q8(address(x), x.shape[0], k, address(packed), address(scale), address(offset), n,
                       None if bias is None else address(bias), address(y))
    return y


def int8_linear(lib: ctypes.CDLL, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """x (rows, in) fp32 contiguous @ (qweight * scale[:, None]).T (+ bias): (rows, out) fp32."""
    n, k = qweight.shape
    y = _out(x, n)
    lib.int8_linear(address(x), x.shape[0], k, address(qweight), address(scale), n,
                    None if bias is None else address(bias), address(y))
    return y


class Bound:
    """One weight's decode call, its tensors' addresses taken once: (rows, in) fp32 contiguous x ->
    (rows, out) fp32. ~5 us less per call than the functions above (121 calls a decode step).
    Holds the tensors, so the addresses stay valid; a module whose buffers move binds again."""

    def __init__(self, fn, n: int, k: int, tensors: tuple, args: tuple) -> None:
        self.fn, self.n, self.k, self.tensors, self.args = fn, n, k, tensors, args

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape[0], self.n)
        self.fn(x.data_ptr(), x.shape[0], self.k, *self.args, y.data_ptr())
        return y


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else address(t)


def bind_int4(lib: ctypes.CDLL, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
              group: int, bias: torch.Tensor | None, int8_activations: bool = False) -> Bound:
    """`int4_linear` (or `int4_linear_q8`, groups of 32) on this weight, as a `Bound` call."""
    n, k = packed.shape[0], packed.shape[1] * 2
    head = (_ptr(packed), _ptr(scale), _ptr(offset), n)
    if int8_activations:
        return Bound(lib.int4_linear_q8, n, k, (packed, scale, offset, bias), (*head, _ptr(bias)))
    return Bound(lib.int4_linear, n, k, (packed, scale, offset, bias), (*head, group, _ptr(bias)))


def bind_int8(lib: ctypes.CDLL, qweight: torch.Tensor, scale: torch.Tensor,
              bias: torch.Tensor | None) -> Bound:
    """`int8_linear` on this weight, as a `Bound` call."""
    n, k = qweight.shape
    return Bound(lib.int8_linear, n, k, (qweight, scale, bias), (_ptr(qweight), _ptr(scale), n, _ptr(bias)))


def int4_dequantize(lib: ctypes.CDLL, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                    group: int) -> torch.Tensor:
    """The fp32 (out, in) weight of a repacked int4 set."""
    n, k = packed.shape[0], packed.shape[1] * 2
    w = torch.empty(n, k, dtype=torch.float32)
    lib.int4_dequantize(address(packed), address(scale), address(offset), n, k, group, address(w))
    return w


def int8_dequantize(lib: ctypes.CDLL, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 (out, in) weight of an int8 (qweight, scale) pair."""
    w = torch.empty(qweight.shape, dtype=torch.float32)
    lib.int8_dequantize(address(qweight), address(scale), qweight.shape[0], qweight.shape[1], address(w))
    return w


def agrees_with_reference(lib: ctypes.CDLL) -> bool:
    """Whether the library computes what the torch references do, on shapes that take every
    path (row tiles of 4 and a remainder, a group of 64, an in_features not a multiple of 16)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 128, generator=gen)
    q4 = torch.randint(0, 256, (5, 64), dtype=torch.uint8, generator=gen)
    scale4, offset4 = torch.rand(5, 2, generator=gen), -torch.rand(5, 2, generator=gen)
    bias = torch.randn(5, generator=gen)
    want = x @ dequantize_int4(q4, scale4, offset4, 64).T + bias
    got = int4_linear(lib, x, repack_int4(q4), scale4, offset4, 64, bias)
    q8 = torch.randint(-127, 128, (5, 40), dtype=torch.int8, generator=gen)
    scale8 = torch.rand(5, generator=gen)
    x8 = x[:, :40].contiguous()
    want8 = x8 @ dequantize_int8(q8, scale8).T
    got8 = int8_linear(lib, x8, q8, scale8, None)
    w4 = int4_dequantize(lib, repack_int4(q4), scale4, offset4, 64)
    return (torch.allclose(got, want, rtol=1e-4, atol=1e-3)
            and torch.allclose(got8, want8, rtol=1e-4, atol=1e-3)
            and torch.allclose(w4, dequantize_int4(q4, scale4, offset4, 64), rtol=1e-6, atol=1e-6)
            and torch.equal(int8_dequantize(lib, q8, scale8), dequantize_int8(q8, scale8)))


@functools.cache
def kernels() -> ctypes.CDLL | None:
    """The gemv library, declared and checked against the references; None keeps the torch path."""
    lib = load("gemv")
    if lib is None:
        return None
    declare(lib)
    with torch.inference_mode():
        if not agrees_with_reference(lib):
            log.warning("native gemv kernels disagree with the torch reference: using the torch path")
            return None
    return lib
