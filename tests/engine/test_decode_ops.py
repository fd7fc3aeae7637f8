"""The native CPU decode ops (engine/native/decode_ops.cpp) against the torch references they
replace, at many shapes: fp32 rounding apart (bit for bit where the math is the same)."""

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.activation import silu_and_mul_torch
from engine.kernels.norm import rms_norm_torch
from engine.kernels.rope import rope_rows, rotate_heads
from engine.native import build, decode_ops

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler here")


@pytest.fixture(scope="module")
def ops():
    built = decode_ops.get()
    assert built is not None, "the decode ops did not build"
    return built


@pytest.mark.parametrize("rows,n", [(1, 576), (3, 64), (5, 2048), (2, 17)])
def test_rms_norm_with_and_without_the_residual_add_matches_the_torch_reference(ops, rows, n):
    g = torch.Generator().manual_seed(rows * n)
    x, residual, weight = (torch.randn(rows, n, generator=g), torch.randn(rows, n, generator=g),
                           torch.randn(n, generator=g))
    ref, ref_residual = rms_norm_torch(x, weight, 1e-5, residual.clone())
    got_residual = residual.clone()
    got = ops.add_rms_norm(x, got_residual, weight, 1e-5)
    assert torch.equal(got_residual, ref_residual)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ops.add_rms_norm(x, None, weight, 1e-6),
                               rms_norm_torch(x, weight, 1e-6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows,inter", [(1, 1536), (4, 33), (2, 8192)])
def test_silu_and_mul_matches_the_torch_reference(ops, rows, inter):
    x = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 6
    torch.testing.assert_close(ops.silu_and_mul(x), silu_and_mul_torch(x), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 128), (8, 2, 64)])
def test_rope_and_kv_write_rotates_q_and_k_in_place_and_stores_k_and_v_at_their_slots(
        ops, heads, kv_heads, head_dim):
    g = torch.Generator().manual_seed(heads)
    tokens, block_size, blocks = 5, 16, 8
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(300).float(), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    positions = torch.tensor([0, 7, 16, 255, 299])
    slots = torch.tensor([3, 40, 17, 127, 64])
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g)
    k_cache = torch.zeros(blocks, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)

    qk = qkv[:, : (heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    rotated = rotate_heads(qk, rope_rows(positions, cos, sin))
    v = qkv[:, (heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim).clone()
    ops.rope_kv_write(qkv, positions, cos, sin, k_cache, v_cache, slots, heads, kv_heads, head_dim)

    assert torch.equal(qk, rotated), "the same products and sums as the reference: the same bits"
    flat_k, flat_v = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
    assert torch.equal(flat_k[slots], rotated[:, heads:])
    assert torch.equal(flat_v[slots], v)
    untouched = torch.ones(blocks * block_size, dtype=torch.bool)
    untouched[slots] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


def _reference_attention(q, k_cache, v_cache, tables, lens, scale):
    """Each sequence's context gathered out of the pool, then SDPA: the torch path's math."""
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    outs = []
    for s, ctx in enumerate(lens.tolist()):
        n = (ctx + block_size - 1) // block_size
        ks = k_cache[tables[s, :n]].flatten(0, 1)[:ctx].transpose(0, 1)[None]
        vs = v_cache[tables[s, :n]].flatten(0, 1)[:ctx].transpose(0, 1)[None]
        qs = q[s].view(kv_heads, -1, q.shape[-1])[None]  # a KV head's group as its query rows
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].reshape(-1))
    return torch.stack(outs)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 128), (6, 2, 128), (3, 3, 64)])
@pytest.mark.parametrize("lens", [[1], [15], [16], [17], [127, 128, 129], [300, 5, 33, 256, 1]])
def test_decode_attention_over_the_paged_pool_matches_gather_then_sdpa(ops, heads, kv_heads,
                                                                       head_dim, lens):
    g = torch.Generator().manual_seed(sum(lens) + heads + head_dim)
    block_size = 16
    width = max((n + block_size - 1) // block_size for n in lens)
    num_blocks = width * len(lens) + 3
    # Each sequence on blocks scattered across the pool, in no order.
    order = torch.randperm(num_blocks, generator=g)[: width * len(lens)]
    tables = order.view(len(lens), width).contiguous()
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    q = torch.randn(len(lens), heads, head_dim, generator=g) * 3
    context = torch.tensor(lens)
    scale = head_dim**-0.5
    got = ops.decode_attention(q, k_cache, v_cache, tables, context, heads, scale)
    ref = _reference_attention(q, k_cache, v_cache, tables, context, scale)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-6)
    # A row's result does not depend on the other rows of the batch.
    alone = ops.decode_attention(q[-1:], k_cache, v_cache, tables[-1:], context[-1:], heads, scale)
    assert torch.equal(alone, got[-1:])


HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def two_sequences(seed: int):
    """A fused qkv output of two decode tokens and a pool of six blocks (of 16) holding their
    40 and 33 tokens, on blocks 0, 2, 4 and 1, 3, 5."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(2, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g)
    k_cache = torch.randn(6, 16, KV_HEADS, HEAD_DIM, generator=g)
    v_cache = torch.randn(6, 16, KV_HEADS, HEAD_DIM, generator=g)
    return qkv, k_cache, v_cache, torch.tensor([[0, 2, 4], [1, 3, 5]]), torch.tensor([40, 33])


def test_decode_attention_reads_q_out_of_the_fused_qkv_rows(ops):
    heads, head_dim = HEADS, HEAD_DIM
    qkv, k_cache, v_cache, tables, lens = two_sequences(1)
    q = qkv[:, : heads * head_dim].contiguous().view(2, heads, head_dim)
    as_rows = ops.decode_attention(qkv, k_cache, v_cache, tables, lens, heads, 0.125)
    assert torch.equal(as_rows, ops.decode_attention(q, k_cache, v_cache, tables, lens, heads, 0.125))


def test_rope_write_attend_is_rope_kv_write_then_decode_attention(ops):
    heads, kv_heads, head_dim = HEADS, KV_HEADS, HEAD_DIM
    qkv, k_cache, v_cache, tables, lens = two_sequences(2)
    freqs = torch.outer(torch.arange(64).float(), torch.linspace(0.01, 1.0, head_dim // 2))
    cos, sin = freqs.cos(), freqs.sin()
    positions, slots = lens - 1, torch.tensor([4 * 16 + 7, 3 * 16 + 0])
    caches, qkv2 = (k_cache.clone(), v_cache.clone()), qkv.clone()
    got = ops.rope_write_attend(qkv, positions, cos, sin, k_cache, v_cache, slots, tables, lens,
                                heads, 0.125)
    ops.rope_kv_write(qkv2, positions, cos, sin, *caches, slots, heads, kv_heads, head_dim)
    want = ops.decode_attention(qkv2, *caches, tables, lens, heads, 0.125)
    assert torch.equal(got, want) and torch.equal(qkv, qkv2)
    assert torch.equal(k_cache, caches[0]) and torch.equal(v_cache, caches[1])
    with pytest.raises(ValueError, match="one token a sequence"):
        ops.rope_write_attend(qkv, positions, cos, sin, k_cache, v_cache, slots, tables[:1],
                              lens[:1], heads, 0.125)


def test_bad_inputs_are_refused_with_a_clear_error(ops):
    with pytest.raises(ValueError, match="contiguous float32"):
        ops.add_rms_norm(torch.zeros(2, 8, dtype=torch.float64), None, torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="contiguous float32"):
        ops.silu_and_mul(torch.zeros(8, 2).t())
    with pytest.raises(ValueError, match="int64"):
        ops.decode_attention(torch.zeros(1, 4, 8), torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8),
                             torch.zeros(1, 2, dtype=torch.int32), torch.tensor([3]), 4, 1.0)
    with pytest.raises(ValueError, match="one block table"):
        ops.decode_attention(torch.zeros(2, 4, 8), torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8),
                             torch.zeros(1, 2, dtype=torch.int64), torch.tensor([3]), 4, 1.0)
