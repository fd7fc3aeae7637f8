"""Weight-only quantized linears (engine/layers/quant_linear.py) against float references of the SAME
quantized weights: int4 near exact (same math, another kernel), int8 within the error of quantizing
the activations per call; and the option's resolution and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.config import EngineConfig
from engine.layers.quant import (
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)
from engine.layers.quant_linear import Fp16Linear, Int4Linear, Int8Linear, quantized_linear


def linear(out_f: int, in_f: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.5)
    return lin


def test_int4_layout_low_nibble_is_the_even_column():
    q = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert torch.equal(unpack_int4(packed), q)
    w = dequantize_int4(packed, torch.tensor([[2.0]]), torch.tensor([[-1.0]]), group=4)
    assert w.tolist() == [[1.0, 3.0, 29.0, -1.0]]


@pytest.mark.parametrize("group", [32, 128])
def test_int4_linear_matches_dequantize_then_fp32(group):
    lin = linear(96, 256)
    q, scale, offset = quantize_int4(lin.weight.detach(), group)
    mod = Int4Linear(q, scale, offset, group, lin.bias.detach())
    x = torch.randn(7, 256)
    with torch.inference_mode():
        want = x @ dequantize_int4(q, scale, offset, group).T + lin.bias
        got = mod(x)
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("rows", [1, 9])  # the one-row GEMV and the dequantizing path
def test_int8_linear_matches_dequantize_then_fp32(rows):
    lin = linear(192, 576)
    q, scale = quantize_int8(lin.weight.detach())
    mod = Int8Linear(q, scale, lin.bias.detach())
    x = torch.randn(rows, 576)
    with torch.inference_mode():
        want = x @ dequantize_int8(q, scale).T + lin.bias
        got = mod(x)
    # Weight-only: the activations are not rounded, so only the summation order differs.
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("rows", [1, 9])
def test_fp16_linear_is_fp32_math_on_fp16_weights(rows):
    lin = linear(192, 576)
    mod = quantized_linear(lin, "fp16")
    assert isinstance(mod, Fp16Linear)
    x = torch.randn(rows, 576)
    with torch.inference_mode():
        want = x @ lin.weight.half().float().T + lin.bias
        got = mod(x)
    assert (got - want).abs().max().item() < 1e-4


def test_fp16_linear_on_the_models_2d_rows_dispatches_the_op_alone_with_the_same_bits():
    """The decode hot path: a [rows, in] float32 input goes to fbgemm as it is, without the
    reshape/cast/view ops (no-ops there, ~5 us a call: 0.6 ms a step over 121 linears)."""
    mod = quantized_linear(linear(192, 576), "fp16")
    x = torch.randn(3, 576)
    with torch.inference_mode(), torch.profiler.profile() as prof:
        got = mod(x)
    keys = {e.key for e in prof.key_averages()}
    assert not keys & {"aten::reshape", "aten::view", "aten::to"}, keys
    with torch.inference_mode():
        assert torch.equal(got, mod(x[None])[0])  # the general path (3-D input), same bits


def test_quantized_linear_int4_needs_whole_groups_else_int8():
    assert isinstance(quantized_linear(linear(8, 96), "int4"), Int4Linear)
    assert isinstance(quantized_linear(linear(8, 80), "int4"), Int8Linear)


def test_bad_quantization_value_names_the_option():
    with pytest.raises(ValueError, match="quantization='int3'"):
        EngineConfig(quantization="int3")


def test_auto_keeps_a_quantized_gguf_quantized():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    auto = EngineConfig()
    assert auto.resolve_quantization(cuda, checkpoint_quantized=True) == "int4"
    assert auto.resolve_quantization(cuda, checkpoint_quantized=False) is None
    # On the CPU the native int4 kernels (fbgemm's fp16 weights without them: tests/engine/test_gemv.py).
    assert auto.resolve_quantization(cpu, checkpoint_quantized=True) in ("int4-fp16", "int4", "fp16")
    assert auto.resolve_quantization(cpu, checkpoint_quantized=False) is None
    assert EngineConfig(dtype="float32").resolve_quantization(cuda, checkpoint_quantized=True) is None
    for off in (None, "none"):
        assert EngineConfig(quantization=off).resolve_quantization(cpu, True) is None
    assert EngineConfig(quantization="int4").resolve_quantization(cpu, False) == "int4"


def test_engine_table_takes_quantization_and_names_a_bad_value(tmp_path):
    from openclaw.config import ConfigError, load_config

    path = tmp_path / "openclaw.toml"
    path.write_text('[engine]\nquantization = "int4"\n')
    assert load_config(path).engine.quantization == "int4"
    path.write_text('[engine]\nquantization = "int3"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems[0].startswith('engine.quantization = "int3": expected')
