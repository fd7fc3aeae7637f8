"""CPU linear layers through oneDNN (engine/layers/linear.py) against F.linear on the same weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import LLM
from engine.layers.linear import PackedLinear, onednn_available, pack_linears

from .hf_reference import build_tiny_checkpoint

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 3, 16, 200])
def test_packed_linear_matches_f_linear(bias, rows):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 40, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(rows, 96)
    expect = F.linear(x, linear.weight, linear.bias)
    got = packed(x)
    assert got.shape == expect.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)


def test_inputs_that_are_views_or_have_more_dimensions():
    linear = nn.Linear(64, 32)
    packed = PackedLinear(linear)
    wide = torch.randn(7, 200)
    view = wide[:, 10:74]  # not contiguous, like q/k/v split off a fused projection
    torch.testing.assert_close(packed(view), F.linear(view, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    x = torch.randn(2, 5, 64)
    torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


def test_bf16_weights_are_packed_and_fp16_ones_are_left_alone():
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8)).to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    expect = model(x)
    assert pack_linears(model) == 2 and isinstance(model[2], PackedLinear)
    torch.testing.assert_close(model(x), expect, rtol=2e-2, atol=2e-2)
    half = nn.Sequential(nn.Linear(32, 8)).half()
    assert pack_linears(half) == 0 and isinstance(half[0], nn.Linear)


def test_the_engine_packs_every_projection_and_keeps_a_tied_embedding(tmp_path):
    folder = build_tiny_checkpoint("llama", tmp_path)
    llm = LLM(model=str(folder), kv_cache_gib=0.01)
    model = llm.engine.runner.model
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 1 + 4 * model.config.num_layers  # LM head; qkv, o, gate-up, down
    assert isinstance(model.embed_tokens.weight, nn.Parameter) and not model.embed_tokens.weight.is_mkldnn
