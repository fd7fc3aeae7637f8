"""CPU linear layers through oneDNN (engine/layers/linear.py) against F.linear on the same weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import LLM, SamplingParams
from engine.layers.linear import EXACT_ROWS, PackedLinear, bucket_rows, onednn_available, pack_linears
from tests.helpers.hf_reference import build_tiny_checkpoint

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 3, 16, 17, 200, 1000])
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
    # The same with row counts that are padded to a bucket (37 -> 40, 3 * 7 = 21 -> 22).
    view = torch.randn(37, 200)[:, 10:74]
    torch.testing.assert_close(packed(view), F.linear(view, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    x = torch.randn(3, 7, 64)
    got = packed(x)
    assert got.shape == (3, 7, 32)
    torch.testing.assert_close(got, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)


def test_row_buckets_are_exact_for_decode_batches_then_few_and_tight():
    assert [bucket_rows(m) for m in range(EXACT_ROWS + 1)] == list(range(EXACT_ROWS + 1))
    rows = range(1, 8193)
    buckets = [bucket_rows(m) for m in rows]
    assert all(m <= b <= m * 1.125 for m, b in zip(rows, buckets, strict=True))  # at most 12.5% more
    assert buckets == sorted(buckets)
    assert all(bucket_rows(b) == b for b in buckets)  # a bucket is its own bucket
    # 16 exact, then 8 per doubling: 72 shapes for any step of up to 2048 tokens, 88 up to 8192.
    assert len(set(buckets[:2048])) == 72 and len(set(buckets)) == 88


def test_padding_leaves_the_real_rows_as_they_were():
    """oneDNN's rows do not depend on each other, so padding changes nothing in the real rows (on
    the machine of docs/BENCHMARKS.md, not one bit; another CPU's kernel may block rows otherwise,
    so the test allows float32 rounding)."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=False)
    packed = PackedLinear(linear)
    for rows in (17, 21, 45, 133, 300):
        x = torch.randn(rows, 96)
        exact = torch.ops.mkldnn._linear_pointwise(x, packed.weight, None, "none", [], "")
        assert bucket_rows(rows) != rows
        torch.testing.assert_close(packed(x), exact, rtol=1e-5, atol=1e-5)


def test_the_engine_sends_onednn_a_bounded_set_of_row_counts(tmp_path, monkeypatch):
    """oneDNN JIT-builds and caches a primitive per input shape (about 0.6 MB of native memory
    each, in caches of 1024 entries): prompts of every length must not mean a shape per length,
    or a long-running daemon's memory grows by hundreds of MB (docs/BENCHMARKS.md, CPU)."""
    folder = build_tiny_checkpoint("llama", tmp_path)
    llm = LLM(model=str(folder), kv_cache_gib=0.01, enable_prefix_caching=False)
    rows_seen: set[int] = set()
    op = torch.ops.mkldnn._linear_pointwise

    def recording(x, *args):
        rows_seen.add(x.numel() // x.shape[-1])
        return op(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", recording)
    lengths = range(1, 301)
    for n in lengths:
        llm.generate([[3 + (i * 7) % 300 for i in range(n)]], SamplingParams(max_tokens=2, temperature=0))
    assert 1 in rows_seen and max(rows_seen) >= 300  # decode steps and the longest prefill went through
    assert all(bucket_rows(m) == m for m in rows_seen)
    assert len(rows_seen) <= len({bucket_rows(n) for n in lengths}) == 50  # not 300


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
