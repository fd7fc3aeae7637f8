"""The fused Triton kernels (RMSNorm with residual, RoPE in place, SiLU-and-mul) against their torch
references on tiny ragged shapes: natively on CUDA when there is one (fp32, fp16, bf16), otherwise
on the CPU under the Triton interpreter (fp32, fp16: the interpreter gets bf16 wrong).

How triton (3.x, checked on 3.9) reads TRITON_INTERPRET: `triton.jit` consults it each time it
wraps a function. Our kernels are wrapped on first call, once per value of the variable, so for
them any moment before the first call would do; but triton's own helpers (tl.sum, tl.max, ...) are
wrapped when triton is first imported, and natively wrapped helpers cannot run inside the
interpreter. So the variable is set below before triton is imported, and only on a machine
without CUDA: there, the engine never imports triton, so nothing else imports it first (the
attention tests set the same variable the same way). On CUDA it is left alone, since interpreting
there would turn every later kernel launch of the test session into an interpreted one.
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

from engine.kernels.activation import silu_and_mul_torch, silu_and_mul_triton
from engine.kernels.norm import rms_norm_torch, rms_norm_triton
from engine.kernels.rope import rope_torch, rope_triton_
from engine.layers.rotary import RotaryEmbedding, rope_inv_freq
from tests.engine.sm90_compile import compile_for_sm90

triton = pytest.importorskip("triton")

if torch.cuda.is_available():
    CASES = [("cuda", torch.float32), ("cuda", torch.float16), ("cuda", torch.bfloat16)]
else:
    CASES = [("cpu", torch.float32), ("cpu", torch.float16)]
# Kernels and references round at the same points, so the differences are an ulp or two of the
# dtype at the magnitudes involved (norm outputs up to ~4, rotated values up to ~5).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 4e-2}


@pytest.fixture(params=CASES, ids=[f"{d}-{str(t).removeprefix('torch.')}" for d, t in CASES])
def case(request) -> tuple[torch.device, torch.dtype]:
    device, dtype = request.param
    if device == "cpu" and not _helpers_interpreted():
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set, so its own helpers "
                    "(tl.sum) cannot run in the interpreter: set TRITON_INTERPRET=1 in every test "
                    "module that imports triton on a CPU-only machine, before the import")
    if device == "cuda" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set for this session (by another test module), so these would "
                    "test the interpreter, not the compiled kernels: run this file alone")
    return torch.device(device), dtype


def _helpers_interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.standard.sum, InterpretedFunction)


def randn(*shape: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


# ---- RMSNorm ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,hidden", [(5, 72), (1, 64), (3, 130)])
def test_rms_norm_matches_the_reference(case, rows, hidden):
    device, dtype = case
    x = randn(rows, hidden, dtype=dtype, device=device) * 3
    weight = randn(hidden, dtype=dtype, device=device, seed=1).abs() + 0.5
    got = rms_norm_triton(x, weight, 1e-6)
    want = rms_norm_torch(x, weight, 1e-6)
    assert_close(got, want, dtype)
    assert not torch.allclose(got.float(), x.float(), atol=0.1)  # it really normalised


def test_rms_norm_with_residual_returns_the_normed_sum_and_the_sum(case):
    device, dtype = case
    x, residual = randn(7, 72, dtype=dtype, device=device), randn(7, 72, dtype=dtype, device=device, seed=2)
    weight = randn(72, dtype=dtype, device=device, seed=1).abs() + 0.5
    got, got_sum = rms_norm_triton(x, weight, 1e-5, residual)
    want, want_sum = rms_norm_torch(x, weight, 1e-5, residual)
    assert torch.equal(got_sum, want_sum)  # one rounded add each: bit-identical
    assert_close(got, want, dtype)
    assert_close(got, rms_norm_torch(x + residual, weight, 1e-5), dtype)


def test_rms_norm_of_strided_heads_normalises_each_head(case):
    # Qwen3's qk-norm: q is a [tokens, heads, head_dim] view of the wider fused qkv output.
    device, dtype = case
    qkv = randn(6, 5 * 24, dtype=dtype, device=device)
    q = qkv[:, : 3 * 24].view(6, 3, 24)
    weight = randn(24, dtype=dtype, device=device, seed=3).abs() + 0.5
    got = rms_norm_triton(q, weight, 1e-6)
    assert got.shape == (6, 3, 24)
    assert_close(got, rms_norm_torch(q, weight, 1e-6), dtype)


# ---- RoPE ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 24), (3, 1, 72), (2, 2, 8)])
def test_rope_rotates_q_and_k_in_place_like_the_reference(case, heads, kv_heads, head_dim):
    device, dtype = case
    tokens = 9
    rotary = RotaryEmbedding(64, rope_inv_freq(head_dim, 10000.0, None, None), device)
    # q and k as the model has them: views into one fused qkv row per token.
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    positions = torch.tensor([0, 5, 63, 1, 17, 17, 2, 40, 9], device=device)
    want_q, want_k = rope_torch(positions, q.clone(), k.clone(), rotary.cos, rotary.sin)
    q_before = q.clone()
    rope_triton_(positions, q, k, rotary.cos, rotary.sin)
    assert_close(q, want_q, dtype)
    assert_close(k, want_k, dtype)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before)  # v untouched
    assert torch.equal(q[0], q_before[0])  # position 0 is the identity
    assert not torch.allclose(q[2].float(), q_before[2].float(), atol=0.1)  # position 63 rotates


def test_rope_pairs_dimension_i_with_i_plus_half(case):
    # The rotate-half convention, spelled out on one vector: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
    device, dtype = case
    head_dim = 8
    cos = torch.full((4, head_dim // 2), 0.6, device=device)
    sin = torch.full((4, head_dim // 2), 0.8, device=device)
    q = torch.arange(1, 9, dtype=dtype, device=device).view(1, 1, head_dim)
    k = q.clone()
    rope_triton_(torch.tensor([3], device=device), q, k, cos, sin)
    x1, x2 = torch.arange(1.0, 5.0), torch.arange(5.0, 9.0)
    want = torch.cat((x1 * 0.6 - x2 * 0.8, x2 * 0.6 + x1 * 0.8))
    assert_close(q.flatten().float().cpu(), want, dtype)


# ---- SiLU-and-mul -------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,inter", [(4, 72), (1, 1100), (3, 5)])
def test_silu_and_mul_matches_the_reference(case, rows, inter):
    device, dtype = case
    x = randn(rows, 2 * inter, dtype=dtype, device=device) * 2
    got = silu_and_mul_triton(x)
    want = silu_and_mul_torch(x)
    assert_close(got, want, dtype)
    gate, up = x.float().chunk(2, dim=-1)
    assert not torch.allclose(want.float(), gate * up, atol=0.1)  # silu is not the identity


def test_silu_and_mul_reads_a_strided_batch_of_rows(case):
    device, dtype = case
    wide = randn(5, 3 * 72, dtype=dtype, device=device)
    x = wide[:, : 2 * 72]  # rows of a wider buffer: stride 216, not 144
    assert_close(silu_and_mul_triton(x), silu_and_mul_torch(x), dtype)


# ---- no triton on the CPU path ------------------------------------------------------------------


def test_engine_and_kernel_modules_import_without_triton():
    """The CPU path must not import triton (it cannot launch there, and importing it costs)."""
    code = ("import sys, engine, engine.kernels.norm, engine.kernels.rope, engine.kernels.activation, "
            "engine.model_runner; print('triton' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"


# ---- every kernel compiles for the H100/H200 (sm_90), no GPU needed ------------------------------

# Each wrapper called as the engine calls it, compiled to a cubin (tests/engine/sm90_compile.py).
_COMPILE_SM90 = r"""
from engine.kernels import attention as A
from engine.kernels.activation import silu_and_mul_triton
from engine.kernels.norm import rms_norm_triton
from engine.kernels.rope import rope_triton_

def attention(dtype, heads, kv_heads, head_dim):
    e = lambda *s, t=dtype: torch.empty(*s, dtype=t)
    k_cache, v_cache = e(64, 16, kv_heads, head_dim), e(64, 16, kv_heads, head_dim)
    qkv = e(8, (heads + 2 * kv_heads) * head_dim)
    q = qkv[:, : heads * head_dim].view(8, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(8, kv_heads, head_dim)
    out, tables = e(8, heads, head_dim), torch.zeros(8, 256, dtype=torch.int64)
    ints = torch.zeros(8, dtype=torch.int64)
    A.store_kv(k, k, k_cache, v_cache, ints)
    A.decode_attention(q, k_cache, v_cache, tables, ints, 0.1, out)  # 4096 tokens: split + reduce
    A.decode_attention(q, k_cache, v_cache, tables[:, :4], ints, 0.1, out)  # one partition
    A.prefill_attention(q, k_cache, v_cache, tables[:2], ints[:2], torch.tensor([0, 3, 8]), 5, 0.1, out)

attention(torch.bfloat16, 16, 8, 128)  # Qwen3-0.6B
attention(torch.float16, 9, 3, 64)  # SmolLM2-135M
attention(torch.float32, 32, 8, 128)  # Llama-3-8B, exact fp32 dot
attention(torch.bfloat16, 32, 8, 128)  # Llama-3-8B as bench/engine_gpu.py runs it
A._needs_64bit_offsets = lambda k_cache: True  # a pool of 2**31 elements or more
attention(torch.bfloat16, 16, 8, 128)
for dtype in (torch.bfloat16, torch.float32):
    x = torch.empty(8, 1024, dtype=dtype)
    rms_norm_triton(x, x[0], 1e-6)
    rms_norm_triton(x, x[0], 1e-6, x)
    qkv = torch.empty(8, 32 * 128, dtype=dtype)
    q, k = qkv[:, : 16 * 128].view(8, 16, 128), qkv[:, 16 * 128 : 24 * 128].view(8, 8, 128)
    rms_norm_triton(q, torch.empty(128, dtype=dtype), 1e-6)
    rope_triton_(torch.zeros(8, dtype=torch.int64), q, k, torch.empty(64, 64), torch.empty(64, 64))
    silu_and_mul_triton(torch.empty(8, 2 * 3072, dtype=dtype))
x = torch.empty(8, 4096, dtype=torch.bfloat16)  # Llama-3-8B: hidden 4096, 32 q and 8 KV heads
rms_norm_triton(x, x[0], 1e-5, x)
qkv = torch.empty(8, 48 * 128, dtype=torch.bfloat16)
rope_triton_(torch.zeros(8, dtype=torch.int64), qkv[:, : 32 * 128].view(8, 32, 128),
             qkv[:, 32 * 128 : 40 * 128].view(8, 8, 128), torch.empty(64, 64), torch.empty(64, 64))
print("COMPILED", len(compiled), sorted(set(compiled)))
"""


def test_every_kernel_compiles_for_sm90_without_a_gpu():
    stdout = compile_for_sm90(_COMPILE_SM90)
    kernels = ["_decode_kernel", "_decode_reduce_kernel", "_prefill_kernel", "_rms_norm_kernel",
               "_rope_kernel", "_silu_and_mul_kernel", "_store_kv_kernel"]
    assert f"COMPILED 37 {kernels}" in stdout, stdout
