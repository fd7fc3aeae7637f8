"""engine/native/gemv.cpp, the CPU's int4/int8 weight-only matmuls, against dequantize-then-fp32
references of the same weights: at the embedded model's shapes and odd ones, Q4_0 and Q4_1 blocks,
through the modules at decode and prefill row counts, without AVX-512, and switched off."""

from __future__ import annotations

import ctypes
import subprocess

import pytest
import torch
from torch import nn

from engine.config import EngineConfig
from engine.layers.quant import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from engine.layers.quant_linear import (
    NATIVE_MAX_ROWS,
    Int4Linear,
    Int8Linear,
    fbgemm_fp16_available,
    quantized_linear,
)
from engine.native import build, gemv

needs_kernels = pytest.mark.skipif(gemv.kernels() is None, reason="no native gemv kernels here")

# fp32 rounding, relative to sum |x| |w| (the size of what is summed): the kernel sums
# scale * sum(q x) + offset * sum(x) where the reference sums (q scale + offset) x, in another order.
# Measured at most 1.5e-7 at these shapes; one nibble read wrong moves a row by ~1/in_features of
# that sum (6e-4 at 1536 columns), so 2e-6 tells rounding from a wrong weight.
REL = 2e-6


def int4_weight(out_f: int, in_f: int, style: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    if style == "q4_1":  # asymmetric: the group's min as offset
        return quantize_int4(torch.randn(out_f, in_f, generator=gen) * 0.05, 32)
    # Q4_0: w = (q - 8) * d, so offset = -8 * scale
    q = torch.randint(0, 16, (out_f, in_f), dtype=torch.uint8, generator=gen)
    scale = torch.rand(out_f, in_f // 32, generator=gen) * 0.01
    from engine.layers.quant import pack_int4

    return pack_int4(q), scale, -8 * scale


def check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    want = x @ w.T + (0 if bias is None else bias)
    bound = x.abs() @ w.abs().T + (0 if bias is None else bias.abs())
    assert got.shape == want.shape and got.dtype == torch.float32
    assert ((got - want).abs() / bound).max().item() < REL


@needs_kernels
@pytest.mark.parametrize("style", ["q4_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 16, 17])
@pytest.mark.parametrize(("out_f", "in_f"), [(960, 576), (577, 1536), (49, 576)])
def test_int4_kernel_is_dequantize_then_fp32_to_rounding(style, rows, out_f, in_f):
    qweight, scale, offset = int4_weight(out_f, in_f, style, seed=rows)
    gen = torch.Generator().manual_seed(100 + rows)
    x, bias = torch.randn(rows, in_f, generator=gen), torch.randn(out_f, generator=gen)
    packed = gemv.repack_int4(qweight)
    got = gemv.int4_linear(gemv.kernels(), x, packed, scale, offset, 32, bias)
    check(got, x, dequantize_int4(qweight, scale, offset, 32), bias)


@needs_kernels
def test_int4_kernel_takes_groups_of_128():
    gen = torch.Generator().manual_seed(7)
    qweight, scale, offset = quantize_int4(torch.randn(33, 640, generator=gen), 128)
    x = torch.randn(6, 640, generator=gen)
    got = gemv.int4_linear(gemv.kernels(), x, gemv.repack_int4(qweight), scale, offset, 128, None)
    check(got, x, dequantize_int4(qweight, scale, offset, 128), None)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 16, 17])
@pytest.mark.parametrize(("out_f", "in_f"), [(49, 576), (577, 1536), (72, 200), (5, 9)])
def test_int8_kernel_is_dequantize_then_fp32_to_rounding(rows, out_f, in_f):
    gen = torch.Generator().manual_seed(rows)
    qweight, scale = quantize_int8(torch.randn(out_f, in_f, generator=gen))
    x = torch.randn(rows, in_f, generator=gen)
    got = gemv.int8_linear(gemv.kernels(), x, qweight, scale, None)
    check(got, x, dequantize_int8(qweight, scale), None)


@needs_kernels
def test_the_dequantizers_give_the_references_weights():
    qweight, scale, offset = int4_weight(50, 576, "q4_1", seed=1)
    lib = gemv.kernels()
    w = gemv.int4_dequantize(lib, gemv.repack_int4(qweight), scale, offset, 32)
    assert torch.allclose(w, dequantize_int4(qweight, scale, offset, 32), rtol=1e-6, atol=1e-7)
    q8, s8 = quantize_int8(torch.randn(50, 200))
    assert torch.equal(gemv.int8_dequantize(lib, q8, s8), dequantize_int8(q8, s8))


def test_repacking_is_lossless():
    qweight = torch.randint(0, 256, (9, 96), dtype=torch.uint8)
    packed = gemv.repack_int4(qweight)
    assert not torch.equal(packed, qweight)
    assert torch.equal(gemv.canonical_int4(packed), qweight)


def module_linear(out_f: int, in_f: int) -> nn.Linear:
    torch.manual_seed(0)
    lin = nn.Linear(in_f, out_f)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        lin.bias.normal_(0, 0.5)
    return lin


@needs_kernels
@pytest.mark.parametrize("rows", [1, NATIVE_MAX_ROWS, NATIVE_MAX_ROWS + 1, 70])
def test_int4_and_int8_modules_run_the_kernel_at_decode_and_dequantize_for_prefill(rows):
    lin = module_linear(577, 576)
    x = torch.randn(1, rows, 576)
    with torch.inference_mode():
        int4 = quantized_linear(lin, "int4")
        assert isinstance(int4, Int4Linear) and int4.native
        w4 = dequantize_int4(gemv.canonical_int4(int4.qweight), int4.scale, int4.offset, 32)
        check(int4(x)[0], x[0], w4, int4.bias)
        int8 = quantized_linear(lin, "int8")
        assert isinstance(int8, Int8Linear) and int8.native
        check(int8(x)[0], x[0], dequantize_int8(int8.qweight, int8.scale), int8.bias)


def test_a_build_without_avx512_compiles_and_agrees(tmp_path):
    """The portable loops: what a CPU without AVX-512 runs (-march=native finds none there)."""
    cxx = build.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler here")
    target = tmp_path / "gemv_portable.so"
    subprocess.run([cxx, "-O2", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-mno-avx512f",
                    str(build.SOURCES / "gemv.cpp"), "-o", str(target)], check=True)
    lib = ctypes.CDLL(str(target))
    gemv.declare(lib)
    assert lib.gemv_vectorized() == 0
    with torch.inference_mode():
        assert gemv.agrees_with_reference(lib)
        qweight, scale, offset = int4_weight(49, 576, "q4_1", seed=3)
        x = torch.randn(5, 576)
        check(gemv.int4_linear(lib, x, gemv.repack_int4(qweight), scale, offset, 32, None), x,
              dequantize_int4(qweight, scale, offset, 32), None)
        assert lib.gemv_q8_vectorized() == 0
        if gemv.kernels() is not None:  # the int8-activation tier's loops: the VNNI kernel's results
            args = (x, gemv.repack_int4(qweight), scale, offset, None)
            bound = x.abs() @ dequantize_int4(qweight, scale, offset, 32).abs().T
            diff = gemv.int4_linear_q8(lib, *args) - gemv.int4_linear_q8(gemv.kernels(), *args)
            assert (diff.abs() / bound).max().item() < REL


@pytest.fixture
def kernels_off(monkeypatch):
    monkeypatch.setenv(build.DISABLE, "0")
    build.load.cache_clear()
    gemv.kernels.cache_clear()
    yield
    monkeypatch.delenv(build.DISABLE)
    build.load.cache_clear()
    gemv.kernels.cache_clear()


def test_switched_off_the_modules_keep_the_torch_path_and_auto_is_fp16(kernels_off):
    assert gemv.kernels() is None
    lin = module_linear(49, 576)
    x = torch.randn(3, 576)
    with torch.inference_mode():
        int4 = quantized_linear(lin, "int4")
        assert not int4.native
        # The canonical layout, as it came: the torch path dequantizes it per call.
        check(int4(x), x, dequantize_int4(int4.qweight, int4.scale, int4.offset, 32), int4.bias)
        assert not quantized_linear(lin, "int8").native
    assert EngineConfig().resolve_quantization(torch.device("cpu"), checkpoint_quantized=True) == "fp16"


@needs_kernels
def test_auto_on_the_cpu_is_int4_through_the_kernels():
    assert EngineConfig().resolve_quantization(torch.device("cpu"), checkpoint_quantized=True) == "int4-fp16"
    assert EngineConfig().resolve_quantization(torch.device("cpu"), checkpoint_quantized=False) is None


@needs_kernels
@pytest.mark.parametrize("rows", [1, 4, 5, 17])
@pytest.mark.parametrize(("out_f", "in_f"), [(960, 576), (577, 1536), (33, 608)])
def test_the_int8_activation_tier_is_the_math_on_block_rounded_activations(rows, out_f, in_f):
    """Each 32-column chunk of x rounded to int8 with its own scale (amax / 127), then the same
    weights: equal to that math in fp32 up to rounding (the integer dots are exact)."""
    qweight, scale, offset = int4_weight(out_f, in_f, "q4_1", seed=rows)
    gen = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, in_f, generator=gen), torch.randn(out_f, generator=gen)
    got = gemv.int4_linear_q8(gemv.kernels(), x, gemv.repack_int4(qweight), scale, offset, bias)
    blocks = x.view(rows, -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    xq = (torch.round(blocks / d) * d).view(rows, in_f)
    offsets = offset.repeat_interleave(32, 1)
    w = dequantize_int4(qweight, scale, offset, 32)
    want = xq @ (w - offsets).T + x @ offsets.T + bias
    bound = x.abs() @ w.abs().T + bias.abs()
    assert ((got - want).abs() / bound).max().item() < REL
    # and it is not exact: the rounding of x shows (what kept it out of "auto")
    assert ((got - (x @ w.T + bias)).abs() / bound).max().item() > 10 * REL


@needs_kernels
def test_int4_q8_modules_use_the_tier_at_decode_only():
    lin = module_linear(64, 576)
    with torch.inference_mode():
        mod = quantized_linear(lin, "int4-q8")
        assert mod.int8_activations
        exact = quantized_linear(lin, "int4")
        x = torch.randn(2, 576)
        assert not torch.allclose(mod(x), exact(x), rtol=0, atol=1e-6)
        x = torch.randn(NATIVE_MAX_ROWS + 1, 576)
        assert torch.equal(mod(x), exact(x))  # prefill: the same dequantized weight


@needs_kernels
def test_auto_keeps_an_8bit_file_at_8_bits_on_the_cpu():
    cpu = torch.device("cpu")
    split = fbgemm_fp16_available()
    assert EngineConfig().resolve_quantization(cpu, True, 8) == ("int8-fp16" if split else "int8")
    assert EngineConfig().resolve_quantization(cpu, True, 4) == ("int4-fp16" if split else "int4")


@needs_kernels
def test_a_native_layer_refuses_what_its_kernel_would_read_wrong():
    lin = module_linear(64, 96)
    with torch.inference_mode():
        int4 = quantized_linear(lin, "int4")
        with pytest.raises(ValueError, match="96 inputs"):  # the kernel would read past the row
            int4(torch.randn(2, 64))
        with pytest.raises(ValueError, match="float32"):  # it reads the scales as float32
            int4.half()
        split = quantized_linear(lin, "int4-fp16") if fbgemm_fp16_available() else None
    if split is not None:  # a replaced part is the one that runs
        split.few = quantized_linear(lin, "int8")
        x = torch.randn(1, 96)
        with torch.inference_mode():
            assert torch.equal(split(x), split.few(x))
