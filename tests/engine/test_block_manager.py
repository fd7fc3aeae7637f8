"""The KV block pool: all-or-nothing allocation, reference counts, and the prefix cache's hits,
revivals and least-recently-freed eviction, checked on token ids alone (no model)."""

from __future__ import annotations

import builtins

import pytest

import engine.block_manager as block_manager_module
from engine.block_manager import BlockManager, salt_key
from engine.sequence import Sequence

BS = 4  # block size in every test below


def seq_of(*tokens: int | range, salt: str | None = None) -> Sequence:
    ids: list[int] = []
    for t in tokens:
        ids.extend(t if isinstance(t, range) else [t])
    return Sequence("r", ids, cache_root=salt_key(salt))


def compute(bm: BlockManager, seq: Sequence, cached: list[int] | None = None) -> None:
    """Allocate, 'run' and commit all of `seq`'s remaining tokens, as one scheduler step would."""
    cached = cached if cached is not None else bm.find_cached_prefix(seq)
    n = seq.num_tokens - seq.num_computed_tokens - len(cached) * bm.block_size
    assert bm.allocate(seq, n, cached)
    seq.num_computed_tokens += n
    bm.commit(seq)


def ref_counts(bm: BlockManager) -> list[int]:
    return [b.ref_count for b in bm.blocks]


def assert_all_free(bm: BlockManager) -> None:
    assert bm.num_free_blocks == bm.num_blocks
    assert ref_counts(bm) == [0] * bm.num_blocks


# ---- allocation --------------------------------------------------------------------------


def test_allocate_takes_ceil_blocks_and_grows_only_when_a_block_fills() -> None:
    bm = BlockManager(8, BS)
    seq = seq_of(range(10))
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    seq.num_computed_tokens = 10
    seq.token_ids += [10, 11]
    assert bm.allocate(seq, 2)  # 12 tokens still fit 3 blocks
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    seq.num_computed_tokens = 12
    seq.token_ids.append(12)
    assert bm.allocate(seq, 1)
    assert len(seq.block_table) == 4 and bm.num_free_blocks == 4
    assert len(set(seq.block_table)) == 4
    assert all(bm.blocks[b].ref_count == 1 for b in seq.block_table)


def test_allocate_is_all_or_nothing_when_the_pool_is_too_small() -> None:
    bm = BlockManager(4, BS)
    first = seq_of(range(10))
    assert bm.allocate(first, 10)
    before = (ref_counts(bm), bm.num_free_blocks, bm.stats.queries, bm.stats.hits)
    second = seq_of(range(100, 108))
    assert not bm.allocate(second, 8)  # needs 2 blocks, 1 is free
    assert second.block_table == [] and second.num_computed_tokens == 0
    assert (ref_counts(bm), bm.num_free_blocks, bm.stats.queries, bm.stats.hits) == before
    assert bm.allocate(second, 4)  # a first chunk that fits does
    assert bm.num_free_blocks == 0


def test_allocate_counts_revived_cached_blocks_against_the_free_pool() -> None:
    bm = BlockManager(3, BS)
    a = seq_of(range(9))  # two full blocks plus one token
    compute(bm, a)
    kept = a.block_table[:2]
    bm.free(a)
    hog = seq_of(range(100, 104))
    assert bm.allocate(hog, 4)  # takes the uncached tail block; 2 cached blocks stay free
    b = seq_of(range(9))
    cached = bm.find_cached_prefix(b)
    assert cached == kept
    # Reviving both cached blocks and taking one more needs 3 free blocks; only 2 are.
    assert not bm.allocate(b, 1, cached)
    assert b.block_table == [] and b.num_computed_tokens == 0 and bm.num_free_blocks == 2
    bm.free(hog)
    assert bm.allocate(b, 1, cached)
    assert b.block_table[:2] == cached and b.num_computed_tokens == 8


# ---- sharing and reference counts ----------------------------------------------------------


def test_same_prompt_shares_full_blocks_and_freeing_one_keeps_them_for_the_other() -> None:
    bm = BlockManager(8, BS)
    a = seq_of(range(13))  # three full blocks plus one token
    compute(bm, a)
    b = seq_of(range(13))
    cached = bm.find_cached_prefix(b)
    assert cached == a.block_table[:3]
    compute(bm, b, cached)
    assert b.num_cached_tokens == 12 and b.num_computed_tokens == 13
    assert b.block_table[:3] == a.block_table[:3] and b.block_table[3] != a.block_table[3]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 2, 1]
    assert bm.num_free_blocks == 8 - 5

    shared, a_tail = a.block_table[:3], a.block_table[3]
    bm.free(a)
    assert a.block_table == [] and a.num_computed_tokens == 0
    assert [bm.blocks[i].ref_count for i in shared] == [1, 1, 1]
    assert bm.blocks[a_tail].ref_count == 0 and bm.num_free_blocks == 8 - 4
    assert b.block_table[:3] == shared  # b's blocks are untouched
    bm.free(b)
    assert_all_free(bm)


def test_cache_hit_needs_the_whole_chain_so_a_different_first_block_hits_nothing() -> None:
    bm = BlockManager(16, BS)
    compute(bm, seq_of(range(0, 12), 99))
    assert bm.find_cached_prefix(seq_of(range(100, 104), range(4, 12), 99)) == []
    assert len(bm.find_cached_prefix(seq_of(range(0, 8), range(200, 204), 99))) == 2
    assert len(bm.find_cached_prefix(seq_of(range(0, 12), 99))) == 3


def test_colliding_key_is_rejected_by_comparing_token_ids(monkeypatch) -> None:
    # Every key collides: only the token comparison stands between a prompt and another's KV.
    monkeypatch.setattr(block_manager_module, "block_key", lambda parent, tokens: b"42")
    bm = BlockManager(16, BS)
    compute(bm, seq_of(range(0, 8), 99))
    assert bm.find_cached_prefix(seq_of(range(100, 108), 99)) == []
    assert len(bm.find_cached_prefix(seq_of(range(0, 4), range(100, 104), 99))) == 1


def test_keys_do_not_rest_on_pythons_hash_whose_collisions_can_be_built(monkeypatch) -> None:
    # Ints hash modulo 2**61 - 1, so hash((parent, tokens)) collides for parents that far apart,
    # and then the token check cannot help: the colliding block holds the same tokens, computed
    # after another prefix. Stand-in for such a collision: a hash() blind to the parent.
    assert hash((12345, (4, 5))) == hash((12345 + 2**61 - 1, (4, 5)))
    monkeypatch.setattr(block_manager_module, "hash", lambda x: builtins.hash(x[1]), raising=False)
    bm = BlockManager(16, BS)
    compute(bm, seq_of(range(0, 4), range(4, 8), 99))  # [P, T] cached
    compute(bm, seq_of(range(100, 104), 98))  # [Q] cached
    # [Q, T] may take Q only: the cached T's K/V were computed after P.
    assert len(bm.find_cached_prefix(seq_of(range(100, 104), range(4, 8), 99))) == 1


def test_prompt_that_is_a_whole_number_of_blocks_leaves_its_last_block_to_compute() -> None:
    bm = BlockManager(8, BS)
    a = seq_of(range(12))
    compute(bm, a)
    b = seq_of(range(12))
    cached = bm.find_cached_prefix(b)
    assert cached == a.block_table[:2]
    assert bm.allocate(b, 4, cached)
    assert b.num_computed_tokens == 8 and b.num_uncomputed_tokens == 4
    assert len(b.block_table) == 3 and b.block_table[2] != a.block_table[2]
    assert bm.find_cached_prefix(seq_of(range(4))) == []  # one block: nothing may be skipped


def test_commit_keys_only_blocks_that_are_full_and_computed() -> None:
    bm = BlockManager(8, BS)
    a = seq_of(range(10))
    assert bm.allocate(a, 6)
    a.num_computed_tokens = 6
    bm.commit(a)
    assert len(a.block_hashes) == 1
    assert len(bm.find_cached_prefix(seq_of(range(10)))) == 1  # the half-computed block is not
    assert bm.allocate(a, 4)
    a.num_computed_tokens = 10
    bm.commit(a)
    assert len(a.block_hashes) == 2
    assert len(bm.find_cached_prefix(seq_of(range(10)))) == 2


def test_num_cached_tokens_outlives_the_allocations_after_the_hit() -> None:
    bm = BlockManager(8, BS)
    compute(bm, seq_of(range(9)))
    b = seq_of(range(9))
    compute(bm, b)
    assert b.num_cached_tokens == 8
    b.token_ids.append(50)  # the first sampled token, decoded in the next step
    assert bm.allocate(b, 1)
    assert b.num_cached_tokens == 8


# ---- the cache after free: revival and eviction ---------------------------------------------


def test_freed_cached_blocks_are_revived_by_a_later_hit_and_counted_in_stats() -> None:
    bm = BlockManager(8, BS)
    a = seq_of(range(9))
    compute(bm, a)
    assert (bm.stats.queries, bm.stats.hits) == (9, 0)
    kept = a.block_table[:2]
    bm.free(a)
    assert_all_free(bm)
    b = seq_of(range(9))
    cached = bm.find_cached_prefix(b)
    assert cached == kept
    compute(bm, b, cached)
    assert b.block_table[:2] == kept and b.num_cached_tokens == 8
    assert [bm.blocks[i].ref_count for i in kept] == [1, 1]
    assert bm.num_free_blocks == 8 - 3
    assert (bm.stats.queries, bm.stats.hits) == (18, 8)
    assert bm.stats.hit_rate == 8 / 18


def test_uncached_blocks_are_reused_before_cached_ones() -> None:
    bm = BlockManager(4, BS)
    a = seq_of(range(6))  # one full (cached) block, one partial (uncached) block
    compute(bm, a)
    cached_block = a.block_table[0]
    bm.free(a)
    other = seq_of(range(100, 112))
    compute(bm, other)  # three blocks: the partial one and the two never used
    assert cached_block not in other.block_table
    assert bm.find_cached_prefix(seq_of(range(6))) == [cached_block]


def test_eviction_takes_the_least_recently_freed_cached_blocks_first() -> None:
    bm = BlockManager(4, BS)
    old, new = seq_of(range(8)), seq_of(range(100, 108))
    compute(bm, old)
    bm.free(old)
    compute(bm, new)
    bm.free(new)
    assert bm.num_free_blocks == 4
    intruder = seq_of(range(200, 208))
    compute(bm, intruder)  # two blocks: the pool must evict
    assert bm.find_cached_prefix(seq_of(range(8), 7)) == []  # freed first, evicted first
    assert len(bm.find_cached_prefix(seq_of(range(100, 108), 7))) == 2


def test_free_is_tail_first_so_the_head_of_a_prefix_survives_longest() -> None:
    bm = BlockManager(4, BS)
    a = seq_of(range(13))  # three cached blocks and an uncached tail
    compute(bm, a)
    head = a.block_table[:3]
    bm.free(a)
    probe = seq_of(range(13))
    for evicted in range(1, 4):
        hog = seq_of(range(100, 100 + 4 * (evicted + 1)))  # the tail plus `evicted` cached blocks
        assert bm.allocate(hog, hog.num_tokens)
        assert bm.find_cached_prefix(probe) == head[: 3 - evicted]
        bm.free(hog)


def test_reset_prefix_cache_forgets_freed_blocks() -> None:
    bm = BlockManager(8, BS)
    a, b = seq_of(range(9)), seq_of(range(100, 109))
    compute(bm, a)
    compute(bm, b)
    bm.free(a)
    bm.reset_prefix_cache()
    assert bm.find_cached_prefix(seq_of(range(9))) == []
    assert bm.num_free_blocks == 8 - 3
    # b still holds its blocks; sharing them afterwards stays consistent.
    c = seq_of(range(100, 109))
    compute(bm, c)
    bm.free(b)
    bm.free(c)
    assert_all_free(bm)


def test_with_prefix_caching_disabled_nothing_is_ever_a_hit() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = seq_of(range(13))
    compute(bm, a)
    assert a.block_hashes == []
    b = seq_of(range(13))
    assert bm.find_cached_prefix(b) == []
    compute(bm, b)
    assert set(a.block_table).isdisjoint(b.block_table)
    bm.free(a)
    assert bm.find_cached_prefix(seq_of(range(13))) == []
    assert bm.stats.hits == 0
    bm.free(b)
    assert_all_free(bm)


def test_a_pool_needs_at_least_one_block() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(0, BS)


def test_a_cache_salt_shares_blocks_only_with_the_same_salt() -> None:
    bm = BlockManager(16, BS)
    ann = seq_of(range(13), salt="telegram:1")
    compute(bm, ann)
    anns = ann.block_table[:3]
    bm.free(ann)
    # The same tokens under another salt, or none, find nothing: no one learns what Ann sent.
    assert bm.find_cached_prefix(seq_of(range(13), salt="telegram:2")) == []
    assert bm.find_cached_prefix(seq_of(range(13))) == []
    # Ann's next prompt, which starts with the same tokens, reuses all three full blocks; so
    # does a preempted request of hers, whose keys are made again from its salt.
    again = seq_of(range(13), 99, salt="telegram:1")
    assert bm.find_cached_prefix(again) == anns
    # A request without a salt caches under the unsalted keys, apart from Ann's.
    plain = seq_of(range(13))
    compute(bm, plain)
    plains = plain.block_table[:3]
    assert set(plains).isdisjoint(anns)
    bm.free(plain)
    assert bm.find_cached_prefix(seq_of(range(13), 7)) == plains
    assert bm.find_cached_prefix(seq_of(range(13), 7, salt="telegram:1")) == anns
