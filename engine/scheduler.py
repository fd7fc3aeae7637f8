"""Who runs this step: continuous batching under a token budget, chunked prefill, preemption.

There are no prefill and decode phases. Each step, running sequences go first (in priority order):
each gets what it still needs to compute (one token when decoding, the next chunk of a long
prompt otherwise) while the token budget lasts. Then waiting sequences start, their prompts
chunked to the budget that is left. When the pool has no block for a running sequence, the
lowest-priority, newest running sequence is preempted: its blocks are freed and it goes back to
waiting, to be recomputed later (mostly from the prefix cache). So the oldest sequence always makes
progress, and any workload completes with a pool that fits one sequence.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: list[tuple[tuple[int, int], Sequence]] = []  # sorted by (priority, arrival)
        self.running: list[Sequence] = []  # sorted by (priority, arrival)
        self.num_preemptions = 0

    # ---- bookkeeping ---------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        need = self.block_manager.blocks_needed(seq.num_tokens + 1)
        if need > self.block_manager.num_blocks:
            raise ValueError(
                f"request {seq.request_id}: {seq.num_tokens} prompt tokens do not fit the KV pool "
                f"({self.block_manager.num_blocks * self.block_manager.block_size} tokens)"
            )
        seq.status = Status.WAITING
        bisect.insort(self.waiting, (seq.sort_key, seq))

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence for good (finished or aborted), releasing its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting = [(k, s) for k, s in self.waiting if s is not seq]
        self.block_manager.free(seq)
        seq.status = Status.FINISHED

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.allocate(seq, n):
                victim = self.running.pop()  # lowest priority, newest
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    if not self.running and i == 0:  # alone and still too big: cannot progress
                        raise RuntimeError(f"request {seq.request_id} needs more KV blocks than "
                                           f"the pool has ({self.block_manager.num_blocks})")
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
                i += 1
        # New work only when nothing had to give way this step; otherwise it would just be
        # preempted again.
        bm = self.block_manager
        computing: set[int] = set()  # keys of prompt blocks that this step's new prefills fill
        i = 0
        while (i < len(self.waiting) and budget > 0 and not batch.preempted
               and len(self.running) < self.max_num_seqs):
            seq = self.waiting[i][1]
            keys = bm.prompt_block_keys(seq) if seq.num_computed_tokens == 0 else []
            cached = bm.find_cached_prefix(seq, keys) if keys else []
            if len(cached) < len(keys) and keys[len(cached)] in computing:
                # Another prompt admitted this step is computing the very block this one needs
                # next (a shared system prompt): wait one step and take it from the cache.
                i += 1
                continue
            n = min(seq.num_uncomputed_tokens - len(cached) * bm.block_size, budget)
            if not bm.allocate(seq, n, cached):
                break
            del self.waiting[i]
            computing.update(keys[len(cached) : (seq.num_computed_tokens + n) // bm.block_size])
            seq.status = Status.RUNNING
            bisect.insort(self.running, seq, key=lambda s: s.sort_key)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
        return batch

    def update(self, batch: ScheduledBatch) -> None:
        """After the model ran `batch`: its tokens' K/V are in the pool; key the full blocks."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.block_manager.commit(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        bisect.insort(self.waiting, (seq.sort_key, seq))
