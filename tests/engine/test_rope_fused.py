"""RoPE on the CPU: q and k heads, side by side in the fused qkv output, rotate as one tensor."""

from __future__ import annotations

import torch

from engine import LLM
from engine.kernels.rope import rope_rows, rope_torch, rotate_heads
from tests.helpers.hf_reference import build_tiny_checkpoint


def test_q_and_k_rotated_as_one_tensor_have_the_bits_of_two_rotations():
    torch.manual_seed(3)
    n, heads, kv_heads, dim = 5, 6, 2, 16
    cos, sin = torch.randn(32, dim // 2), torch.randn(32, dim // 2)
    positions = torch.tensor([0, 3, 7, 8, 31])
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim)
    qk = qkv[:, : (heads + kv_heads) * dim].view(n, heads + kv_heads, dim)
    q, k = qk.split([heads, kv_heads], 1)
    want_q, want_k = rope_torch(positions, q, k, cos, sin)
    got_q, got_k = rotate_heads(qk, rope_rows(positions, cos, sin)).split([heads, kv_heads], 1)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_a_cpu_layer_rotates_q_and_k_in_one_set_of_kernels(tmp_path):
    """One `cat` per layer for RoPE (the (x2, x1) swap), not one for q and one for k: at batch 1
    each of these small kernels costs as much as the data it moves."""
    llm = LLM(build_tiny_checkpoint("llama", tmp_path), quantization=None, device="cpu",
              kv_cache_gib=0.01)
    layers = llm.engine.runner.model_config.num_layers
    with torch.profiler.profile() as prof:
        llm.engine.runner.prefill_logits([1, 2, 3, 4, 5])
    cats = sum(e.count for e in prof.key_averages() if e.key == "aten::cat")
    assert cats == layers + 2  # + the step's cos and sin rows, built once for every layer
