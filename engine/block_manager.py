"""Paged KV blocks: allocation with reference counts, and the prefix cache.

A full block is keyed by a digest of its token ids chained with its parent block's key, so a key
names the whole prefix up to that block; a hit also compares the block's token ids. Freed blocks
keep their contents and key until the allocator reuses them, least recently freed first, so a
system prompt shared by many conversations is computed once and stays warm.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence as TokenIds
from dataclasses import dataclass, field

from engine.sequence import Sequence


def block_key(parent: bytes | None, tokens: TokenIds[int]) -> bytes:
    """The key of a full block: a cryptographic digest of its parent's key and its token ids.

    Not Python's hash(): its collisions can be built (ints hash modulo 2**61 - 1, and the tuple
    mix is invertible), and the token comparison on a hit cannot catch a colliding block that
    holds the same tokens after another prefix; another prompt's K/V would then be reused.
    """
    data = array("q", tokens).tobytes()
    return hashlib.blake2b((parent or b"") + data, digest_size=16).digest()


def salt_key(cache_salt: str | None) -> bytes | None:
    """The parent key of a request's first block. Requests share cached blocks only when their
    salts match (vLLM's `cache_salt`): otherwise a user could time their own prompts to learn
    whether another user's conversation (a guessed first message, say) sits in the cache."""
    if cache_salt is None:
        return None
    return hashlib.blake2b(cache_salt.encode(), digest_size=16, person=b"cache-salt").digest()


@dataclass(eq=False)
class Block:
    id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens found in the cache

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        # Free blocks, oldest-freed first. Blocks without cached contents sit at the front so
        # they are reused before anything a later request might still hit.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(self.num_blocks))
        self._cached: dict[bytes, int] = {}  # chained key -> block id
        self._num_cached_free = 0  # free blocks that still hold a cached prefix

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix: reusable by a hit until evicted."""
        return self._num_cached_free

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def prompt_block_keys(self, seq: Sequence) -> list[bytes]:
        """The chained keys of `seq`'s full blocks that a prefix hit may cover (all but a last
        token are eligible: the model must run on the last one to sample)."""
        if not self.enable_prefix_caching:
            return []
        keys: list[bytes] = []
        parent = seq.cache_root
        for i in range((seq.num_tokens - 1) // self.block_size):
            parent = block_key(parent, seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            keys.append(parent)
        return keys

    def find_cached_prefix(self, seq: Sequence, keys: list[bytes] | None = None) -> list[int]:
        """Block ids holding the longest cached prefix of `seq`'s tokens (`keys`: its
        prompt_block_keys, when the caller has them already)."""
        hits: list[int] = []
        for i, key in enumerate(self.prompt_block_keys(seq) if keys is None else keys):
            block_id = self._cached.get(key)
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    # ---- changes -------------------------------------------------------------------------

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] | None = None) -> bool:
        """Make room for `num_new_tokens` more tokens of `seq`, first adopting `cached` prefix
        blocks (from find_cached_prefix, on its first schedule). False, changing nothing, if the
        pool is too full."""
        cached = cached or []
        revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        total = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        new = self.blocks_needed(total) - len(seq.block_table) - len(cached)
        if max(new, 0) + revived > len(self._free):
            return False
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
                self._num_cached_free -= 1  # a hit names a block that holds a key
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.hash)
        if seq.num_computed_tokens == 0 and seq.num_preemptions == 0:
            # The first admission: record the prompt tokens the cache served, for the request
            # and the hit ratio. A re-admission after preemption is neither: its hit covers the
            # request's own earlier output too (it could exceed the prompt's length), which the
            # cache did not "serve", and counted it would lift the ratio under memory pressure.
            seq.num_cached_tokens = len(cached) * self.block_size
            self.stats.queries += seq.num_tokens
            self.stats.hits += seq.num_cached_tokens
        seq.num_computed_tokens += len(cached) * self.block_size
        for _ in range(new):
            seq.block_table.append(self._take_free_block())
        return True

    def commit(self, seq: Sequence) -> None:
        """After a step: key every block that is now full and computed, so others can share it."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        for i in range(len(seq.block_hashes), full):
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            parent = seq.block_hashes[i - 1] if i else seq.cache_root
            key = block_key(parent, tokens)
            seq.block_hashes.append(key)
            block = self.blocks[seq.block_table[i]]
            if key not in self._cached:  # the first writer of a prefix keeps the key
                block.hash, block.token_ids = key, tokens
                self._cached[key] = block.id

    def free(self, seq: Sequence) -> None:
        """Release `seq`'s blocks, tail first, so the tail of a prefix is evicted before its head."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.hash is None:
                    self._free.move_to_end(block_id, last=False)
                else:
                    self._num_cached_free += 1
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        for block in self.blocks:
            if block.ref_count == 0 and block.hash is not None:
                self._uncache(block)

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            self._uncache(block)
        block.ref_count = 1
        return block_id

    def _uncache(self, block: Block) -> None:
        """Forget a free block's key (its only callers hold free blocks)."""
        self._num_cached_free -= 1
        if self._cached.get(block.hash) == block.id:
            del self._cached[block.hash]
        block.hash, block.token_ids = None, ()
