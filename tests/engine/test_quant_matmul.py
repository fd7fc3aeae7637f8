"""The weight-only quantized matmul kernels (engine/kernels/quant_matmul.py) against
dequantize-then-matmul in fp32 (engine/layers/quant.py's references): natively on CUDA when there is
one (fp32, fp16, bf16), otherwise on CPU tensors under the Triton interpreter (fp32, fp16: the
interpreter gets bf16 wrong). TRITON_INTERPRET is set before triton is imported, as in
test_triton_kernels.py (which says why).

Tolerance, elementwise: both sides sum K products in fp32, in different orders (the kernel per
K tile and, for int4, per group with the scale and offset applied to the group's sums), so each is
within (K + 8) u * A of the exact value (Higham's bound for a recursive sum, a few roundings more for
the scale, the offset and the bias), u = 2**-24 and A = |x| @ (|q * scale| + |offset|).T + |bias|:
their difference is within twice that. A half-precision output adds at most one ulp of the dtype.
A misplaced nibble, group or scale is off by a sizeable fraction of A, thousands of times more.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from engine.kernels.quant_matmul import Tiles, choose_tiles, int4_weight_matmul, int8_weight_matmul
from engine.layers.quant import dequantize_int4, dequantize_int8, pack_int4, quantize_int4, quantize_int8
from tests.engine.sm90_compile import compile_for_sm90

triton = pytest.importorskip("triton")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


@pytest.fixture(scope="module", autouse=True)
def interpreted_helpers() -> None:
    if DEVICE.type == "cpu":
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(triton.language.standard.sum, InterpretedFunction):
            pytest.fail("triton was imported before TRITON_INTERPRET=1 was set: set it in every test "
                        "module that imports triton on a CPU-only machine, before the import")
    elif os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set on a CUDA machine: run this file alone for the compiled kernels")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, w_abs: torch.Tensor,
          bias: torch.Tensor | None) -> None:
    """got (on DEVICE) against (x.float() @ w.T + bias) in fp32 on the CPU, within the bound above."""
    xf = x.float().cpu()
    b = torch.zeros(w.shape[0]) if bias is None else bias.float().cpu()
    want = xf @ w.T + b
    a = xf.abs() @ w_abs.T + b.abs()
    tol = 2 * (x.shape[-1] + 8) * 2.0**-24 * a
    if x.dtype != torch.float32:
        tol += torch.finfo(x.dtype).eps * want.abs() + torch.finfo(x.dtype).tiny
    assert got.dtype == x.dtype and got.shape == want.shape
    err = (got.float().cpu() - want).abs()
    assert (err <= tol).all(), f"max error {err.max():.3g}, worst over its bound {(err / tol).max():.3g}"


def int4_weight(out: int, cols: int, group: int, style: str, seed: int):
    """(qweight, scale, offset) of a random weight, Q4_1-style (offset = the group's min, from
    quantize_int4) or Q4_0-style (symmetric: offset = -8 * scale)."""
    w = torch.randn(out, cols, generator=gen(seed))
    if style == "q4_1":
        return quantize_int4(w, group)
    q = torch.randint(0, 16, (out, cols), generator=gen(seed + 1))
    scale = torch.rand(out, cols // group, generator=gen(seed + 2)) * 0.1 + 0.01
    return pack_int4(q), scale, -8 * scale


def on_device(*tensors: torch.Tensor | None):
    return [None if t is None else t.to(DEVICE) for t in tensors]


# ---- int8 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("rows,with_bias", [(1, True), (3, False), (16, True), (33, True)])
def test_int8_matches_dequantize_then_matmul(dtype, rows, with_bias):
    # out 72 is no multiple of a column tile (64 or 128), in 200 no multiple of a K tile (128 or 64).
    qweight, scale = quantize_int8(torch.randn(72, 200, generator=gen(rows)))
    x = torch.randn(rows, 200, generator=gen(100 + rows)).to(dtype)
    bias = torch.randn(72, generator=gen(7)).to(dtype) if with_bias else None
    got = int8_weight_matmul(*on_device(x, qweight, scale, bias))
    w = dequantize_int8(qweight, scale)
    check(got, x, w, w.abs(), bias)


def test_int8_without_its_scale_is_far_off():
    # The bound is tight enough to see a wrong scale: all scales doubled fails it.
    qweight, scale = quantize_int8(torch.randn(72, 200, generator=gen(1)))
    x = torch.randn(3, 200, generator=gen(2))
    got = int8_weight_matmul(*on_device(x, qweight, scale * 2))
    w = dequantize_int8(qweight, scale)
    with pytest.raises(AssertionError, match="max error"):
        check(got, x, w, w.abs(), None)


# ---- int4 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("rows,group,style,with_bias", [
    (1, 32, "q4_1", False), (3, 128, "q4_0", True), (16, 32, "q4_0", True), (33, 128, "q4_1", True),
    (33, 32, "q4_0", False),
])
def test_int4_matches_dequantize_then_matmul(dtype, rows, group, style, with_bias):
    cols = 3 * group if group == 32 else 2 * group  # several groups; one K tile each
    qweight, scale, offset = int4_weight(72, cols, group, style, seed=rows)
    x = torch.randn(rows, cols, generator=gen(100 + rows)).to(dtype)
    bias = torch.randn(72, generator=gen(7)).to(dtype) if with_bias else None
    got = int4_weight_matmul(*on_device(x, qweight, scale, offset), group, *on_device(bias))
    w = dequantize_int4(qweight, scale, offset, group)
    w_abs = dequantize_int4(qweight, scale.abs(), offset.abs(), group)  # |q * s| + |o|: q >= 0
    check(got, x, w, w_abs, bias)


def test_int4_reads_column_2j_from_the_low_nibble():
    # One-hot rows pick single columns: row r of x selects column r, so y[r] = w[:, r] exactly.
    group, out = 32, 20
    q = (torch.arange(group).repeat(out, 1) + torch.arange(out)[:, None]) % 16
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # spelled out, not pack_int4
    scale, offset = torch.full((out, 1), 0.5), torch.full((out, 1), -1.0)
    x = torch.eye(16, group)
    got = int4_weight_matmul(*on_device(x, packed, scale, offset), group).cpu()
    assert torch.equal(got, (q[:, :16].float() * 0.5 - 1.0).T)


def test_int4_drops_no_offset():
    # Q4_1's offsets are a large share of each weight: leaving them out fails the bound.
    qweight, scale, offset = int4_weight(72, 96, 32, "q4_1", seed=3)
    x = torch.randn(3, 96, generator=gen(4))
    got = int4_weight_matmul(*on_device(x, qweight, scale, torch.zeros_like(offset)), 32)
    w = dequantize_int4(qweight, scale, offset, 32)
    with pytest.raises(AssertionError, match="max error"):
        check(got, x, w, dequantize_int4(qweight, scale, offset.abs(), 32), None)


# ---- the split-K decode path and the tiling ------------------------------------------------------


@pytest.mark.parametrize("split_k", [3, 5])
def test_split_k_partials_sum_to_the_whole(split_k):
    # 8 K tiles over 3 splits (3, 3, 2) or 5 (2, 2, 2, 2 and one with none, which must add zeros);
    # 72 columns over tiles of 32: a partial last tile. The reduce adds the bias once.
    qweight, scale, offset = int4_weight(72, 256, 32, "q4_1", seed=5)
    qweight8, scale8 = quantize_int8(torch.randn(72, 256, generator=gen(6)))
    x, bias = torch.randn(2, 256, generator=gen(8)), torch.randn(72, generator=gen(9))
    tiles = Tiles(block_m=16, block_n=32, block_k=32, split_k=split_k, num_warps=4, num_stages=2)
    got = int4_weight_matmul(*on_device(x, qweight, scale, offset), 32, *on_device(bias), tiles=tiles)
    check(got, x, dequantize_int4(qweight, scale, offset, 32),
          dequantize_int4(qweight, scale, offset.abs(), 32), bias)
    got8 = int8_weight_matmul(*on_device(x, qweight8, scale8, bias), tiles=tiles)
    w8 = dequantize_int8(qweight8, scale8)
    check(got8, x, w8, w8.abs(), bias)


def test_decode_reads_every_row_in_one_tile_and_splits_k_when_the_layer_is_narrow():
    for rows in (1, 16):
        t = choose_tiles(rows, 1024, 1024, group=128, sms=132)  # 16 column tiles: too few for 132 SMs
        assert t.block_m == 16 and t.block_k == 128 and t.split_k == 4  # 8 K tiles, 2 per split
    wide = choose_tiles(1, 14336, 4096, group=None, sms=132)  # 224 column tiles fill the GPU
    assert wide.split_k == 2 and wide.block_k == 128
    for k_blocks in range(1, 40):  # no split is left without a K tile
        t = choose_tiles(1, 64, 32 * k_blocks, group=32, sms=132)
        per = -(-k_blocks // t.split_k)
        assert (t.split_k - 1) * per < k_blocks


def test_prefill_tiles_grow_with_the_rows_and_do_not_split():
    assert choose_tiles(17, 1024, 1024).block_m == 32
    assert choose_tiles(64, 1024, 1024, group=32).block_m == 64
    big = choose_tiles(512, 1024, 1024, group=128)
    assert (big.block_m, big.block_n, big.block_k, big.split_k, big.num_warps) == (128, 128, 128, 1, 8)
    assert choose_tiles(512, 1024, 1024, x_bytes=4).block_m == 64  # fp32: half the shared memory


# ---- shapes and bad input -----------------------------------------------------------------------


def test_leading_dims_are_kept_strided_rows_are_read_and_zero_rows_give_an_empty_result():
    qweight, scale = quantize_int8(torch.randn(24, 32, generator=gen(1)))
    x = torch.randn(2, 3, 32, generator=gen(2))
    got = int8_weight_matmul(*on_device(x, qweight, scale))
    assert got.shape == (2, 3, 24)
    w = dequantize_int8(qweight, scale)
    check(got.reshape(6, 24), x.reshape(6, 32), w, w.abs(), None)
    assert int8_weight_matmul(*on_device(torch.empty(0, 32), qweight, scale)).shape == (0, 24)
    (columns,) = on_device(torch.randn(32, 5, generator=gen(3)))
    x_t = columns.T  # (5, 32) with a column stride of 5: no contiguous last dim
    check(int8_weight_matmul(x_t, *on_device(qweight, scale)), x_t, w, w.abs(), None)


def test_bad_input_is_refused_with_what_is_wrong(monkeypatch):
    qweight, scale, offset = on_device(*int4_weight(8, 64, 32, "q4_1", seed=1))
    q8, s8 = on_device(*quantize_int8(torch.randn(8, 64, generator=gen(2))))
    (x,) = on_device(torch.randn(2, 64))
    cases = [
        (lambda: int4_weight_matmul(x, qweight, scale, offset, 48), "group 48"),
        (lambda: int4_weight_matmul(x, qweight, scale.double(), offset, 32), "scale must be"),
        (lambda: int4_weight_matmul(x, qweight, scale, offset[:, :1], 32), r"offset must be .*\(8, 2\)"),
        (lambda: int4_weight_matmul(x[:, :32], qweight, scale, offset, 32), "in_features 64"),
        (lambda: int4_weight_matmul(x.long(), qweight, scale, offset, 32), "torch.int64"),
        (lambda: int8_weight_matmul(x, qweight, s8), "must be a row-major 2-D torch.int8"),
        (lambda: int8_weight_matmul(x, q8, s8[:4]), r"scale must be .*\(8,\)"),
        (lambda: int8_weight_matmul(x, q8, s8, s8[:3]), r"bias \(3,\)"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    if DEVICE.type == "cpu":  # no kernel to run the call on
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="runs on CUDA"):
            int4_weight_matmul(x, qweight, scale, offset, 32)


def test_importing_the_module_imports_no_triton():
    # The CPU path imports it with the engine: triton cannot launch there, and importing it costs.
    code = "import sys, engine.kernels.quant_matmul; print('triton' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"


# ---- the kernels compile for the H100/H200 (sm_90) and fit its shared memory, no GPU needed -----

# The wrappers as the engine calls them, compiled to cubins (tests/engine/sm90_compile.py), with the
# device check lifted; each kernel's shared memory must fit sm_90's 227 KiB per block.
_COMPILE_SM90 = r"""
import engine.kernels.quant_matmul as Q
Q._check_device = lambda fn, x: None
e = torch.empty
# Every branch once: bf16 decode int8 split K (+ the reduce, with the bias), bf16 prefill int4 with
# the bias in the epilogue, fp32 (IEEE dot) prefill int4 group 128: the largest shared memory.
Q.int8_weight_matmul(e(1, 4096, dtype=torch.bfloat16), e(1024, 4096, dtype=torch.int8), e(1024),
                     e(1024, dtype=torch.bfloat16))
for dtype in (torch.bfloat16, torch.float32):
    Q.int4_weight_matmul(e(512, 4096, dtype=dtype), e(1024, 2048, dtype=torch.uint8), e(1024, 32),
                         e(1024, 32), 128, e(1024, dtype=dtype) if dtype == torch.bfloat16 else None)
"""


@pytest.mark.slow  # four compiles: 10-20 s of CPU
def test_the_kernels_compile_for_sm90_and_fit_its_shared_memory():
    if DEVICE.type == "cuda":
        pytest.skip("on CUDA the tests above compile and run the kernels for the device itself")
    stdout = compile_for_sm90(_COMPILE_SM90)
    kernels = [line.split() for line in stdout.splitlines() if line.startswith("KERNEL")]
    names = [k[1] for k in kernels]
    assert names == ["_weight_matmul_kernel", "_reduce_kernel", "_weight_matmul_kernel",
                     "_weight_matmul_kernel"], stdout
    assert max(int(k[2]) for k in kernels) <= 227 * 1024, stdout
