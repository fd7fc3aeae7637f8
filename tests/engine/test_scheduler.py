"""The scheduler under a fake model: token budget, seats, chunked prefill, priority, preemption,
and randomized workloads that must finish, free every block and starve no one.

`Sim` drives Scheduler the way EngineCore does. Its fake model "writes" each computed token's id
into a per-block KV array and, before every sample, checks that the slots the sequence would
attend to hold exactly its own tokens, so a wrong cache hit or a write into a shared block fails.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from engine.block_manager import BlockManager
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import Sequence, Status


@dataclass(eq=False)
class Request:
    seq: Sequence
    max_tokens: int
    added_step: int
    finished_step: int | None = None
    aborted: bool = False

    @property
    def work(self) -> int:
        return self.seq.num_prompt_tokens + self.max_tokens


def fake_token(seq: Sequence, position: int | None = None) -> int:
    """The token 'sampled' at `position` (default: the next one): depends on nothing else."""
    position = seq.num_tokens if position is None else position
    return (int(seq.request_id[1:]) * 7_919 + position * 31) % 50_000


class Sim:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 512, prefix_caching: bool = True) -> None:
        self.bm = BlockManager(num_blocks, block_size, prefix_caching)
        self.sched = Scheduler(self.bm, max_num_seqs, max_num_batched_tokens)
        self.requests: dict[str, Request] = {}
        self.kv: dict[int, list[int | None]] = {}
        self.steps = 0
        self.tokens_computed = 0
        self.preempted: list[Sequence] = []

    # ---- requests --------------------------------------------------------------------------

    def add(self, prompt: list[int], max_tokens: int, priority: int = 0) -> Sequence:
        seq = Sequence(f"r{len(self.requests)}", list(prompt), priority=priority)
        self.sched.add(seq)
        self.requests[seq.request_id] = Request(seq, max_tokens, self.steps)
        return seq

    def abort(self, seq: Sequence) -> None:
        self.sched.finish(seq)
        self.requests[seq.request_id].aborted = True

    def unfinished(self) -> list[Sequence]:
        return [r.seq for r in self.requests.values() if r.seq.status is not Status.FINISHED]

    # ---- the step loop ---------------------------------------------------------------------

    def step(self) -> ScheduledBatch:
        before = list(self.sched.running)
        batch = self.sched.schedule()
        self.steps += 1
        self.tokens_computed += batch.num_tokens
        self.preempted += batch.preempted
        self._check_batch(batch, before)
        self._write_kv(batch)
        self.sched.update(batch)
        for seq in batch.seqs:
            if seq.num_computed_tokens == seq.num_tokens:
                self._check_kv(seq)
                seq.token_ids.append(fake_token(seq))
                req = self.requests[seq.request_id]
                if seq.num_output_tokens >= req.max_tokens:
                    self.sched.finish(seq)
                    req.finished_step = self.steps
        if self.bm.num_blocks <= 1024 or self.steps % 32 == 0:
            self._check_pool()
        return batch

    def run(self, max_steps: int = 100_000) -> None:
        while self.sched.has_unfinished():
            self.step()
            assert self.steps <= max_steps, "the workload did not finish"

    # ---- invariants --------------------------------------------------------------------------

    def _check_batch(self, batch: ScheduledBatch, running_before: list[Sequence]) -> None:
        sched, bm = self.sched, self.bm
        assert batch.num_tokens <= sched.max_num_batched_tokens
        assert len(batch) <= sched.max_num_seqs and len(sched.running) <= sched.max_num_seqs
        assert all(n >= 1 for n in batch.num_new_tokens)
        assert len({id(s) for s in batch.seqs}) == len(batch)
        assert all(s.status is Status.RUNNING and s in sched.running for s in batch.seqs)
        keys = [s.sort_key for s in sched.running]
        assert keys == sorted(keys)
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            assert seq.num_computed_tokens + n <= seq.num_tokens
            assert len(seq.block_table) == bm.blocks_needed(seq.num_computed_tokens + n)
        for victim in batch.preempted:
            assert victim in running_before and victim.status is Status.WAITING
            assert victim.block_table == [] and victim.num_computed_tokens == 0
            # Victims are the lowest-priority, newest: everyone still running outranks them.
            assert all(s.sort_key < victim.sort_key for s in sched.running)
        if batch.preempted:  # nothing new starts in a step that had to preempt
            assert all(s in running_before for s in batch.seqs)

    def _write_kv(self, batch: ScheduledBatch) -> None:
        bs = self.bm.block_size
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                block = self.bm.blocks[seq.block_table[pos // bs]]
                assert block.ref_count == 1 and block.hash is None, "write into a shared block"
                self.kv.setdefault(block.id, [None] * bs)[pos % bs] = seq.token_ids[pos]

    def _check_kv(self, seq: Sequence) -> None:
        bs = self.bm.block_size
        seen = [self.kv[seq.block_table[p // bs]][p % bs] for p in range(seq.num_tokens)]
        assert seen == seq.token_ids, f"{seq.request_id} would attend to someone else's KV"

    def _check_pool(self) -> None:
        live = [s for _, s in self.sched.waiting] + self.sched.running
        refs = [0] * self.bm.num_blocks
        for seq in live:
            assert seq.status is not Status.FINISHED
            for b in seq.block_table:
                refs[b] += 1
        assert [b.ref_count for b in self.bm.blocks] == refs
        assert self.bm.num_free_blocks == refs.count(0)
        assert all(s.block_table == [] for _, s in self.sched.waiting)

    def assert_drained(self) -> None:
        assert not self.sched.has_unfinished()
        assert self.bm.num_free_blocks == self.bm.num_blocks
        assert all(b.ref_count == 0 for b in self.bm.blocks)
        for req in self.requests.values():
            assert req.seq.status is Status.FINISHED
            if not req.aborted:
                assert req.seq.num_output_tokens == req.max_tokens, req.seq.request_id


def prompt(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def blocks_for_one(bm_block_size: int, prompt_len: int, max_tokens: int) -> int:
    """Blocks one sequence can ever hold: its last sampled token is never computed."""
    return max(-(-(prompt_len + max_tokens - 1) // bm_block_size), -(-(prompt_len + 1) // bm_block_size))


# ---- budget, seats, order -------------------------------------------------------------------


def test_token_budget_and_max_num_seqs_hold_on_every_step() -> None:
    sim = Sim(num_blocks=400, block_size=4, max_num_seqs=3, max_num_batched_tokens=20)
    for i in range(10):
        sim.add(prompt(5 + 7 * i, start=100 * i), max_tokens=4 + i)
    sizes, seats = [], []
    while sim.sched.has_unfinished():
        batch = sim.step()
        sizes.append(batch.num_tokens)
        seats.append(len(batch))
    assert max(sizes) == 20 and max(seats) == 3  # the limits are reached, never passed
    sim.assert_drained()


def test_decodes_are_scheduled_before_new_prefills() -> None:
    sim = Sim(num_blocks=100, block_size=4, max_num_batched_tokens=8)
    a, b = sim.add(prompt(3), 50), sim.add(prompt(3, 2000), 50)
    sim.step()  # both prompts in one step
    assert a.num_output_tokens == b.num_output_tokens == 1
    late = sim.add(prompt(100, 3000), 5, priority=-1)  # even a higher priority waits its turn
    batch = sim.step()
    assert batch.seqs == [a, b, late]
    assert batch.num_new_tokens == [1, 1, 6]


def test_long_prompt_alone_is_chunked_to_the_budget() -> None:
    sim = Sim(num_blocks=300, block_size=16, max_num_batched_tokens=64)
    seq = sim.add(prompt(1000), 1)
    chunks = []
    while seq.num_output_tokens == 0:
        chunks.append(sim.step().num_new_tokens)
    assert len(chunks) == math.ceil(1000 / 64)
    assert [c[0] for c in chunks] == [64] * 15 + [1000 - 15 * 64]
    sim.assert_drained()


def test_chunked_prefill_shares_steps_with_decodes_that_keep_progressing() -> None:
    sim = Sim(num_blocks=300, block_size=16, max_num_batched_tokens=64)
    decoders = [sim.add(prompt(2, 10 * i), 100) for i in range(2)]
    sim.step()
    long = sim.add(prompt(1000), 1)
    steps = 0
    while long.num_output_tokens == 0:
        outputs = [d.num_output_tokens for d in decoders]
        remaining = long.num_uncomputed_tokens
        batch = sim.step()
        steps += 1
        assert batch.seqs == [*decoders, long] and batch.num_new_tokens == [1, 1, min(62, remaining)]
        assert [d.num_output_tokens for d in decoders] == [o + 1 for o in outputs]
    assert steps == math.ceil(1000 / 62)
    sim.run()
    sim.assert_drained()


def test_lower_priority_number_runs_first_even_when_it_arrives_later() -> None:
    sim = Sim(num_blocks=100, block_size=4, max_num_seqs=1)
    ones = [sim.add(prompt(4, 100 * i), 3, priority=1) for i in range(3)]
    zero = sim.add(prompt(4, 900), 3, priority=0)
    assert sim.step().seqs == [zero]
    sim.run()
    order = sorted(sim.requests.values(), key=lambda r: r.finished_step)
    assert [r.seq for r in order] == [zero, *ones]  # equal priority: arrival order


def test_high_priority_arrival_starts_first_among_waiting_ones() -> None:
    sim = Sim(num_blocks=100, block_size=4, max_num_seqs=1)
    first = sim.add(prompt(4), 5, priority=1)
    sim.step()
    later_one = sim.add(prompt(4, 200), 2, priority=1)
    later_zero = sim.add(prompt(4, 300), 2, priority=0)
    started = []
    while sim.sched.has_unfinished():
        for s in sim.step().seqs:
            if s not in started:
                started.append(s)
    assert started == [first, later_zero, later_one]  # the running one is not displaced
    sim.assert_drained()


def test_running_sequences_are_batched_in_priority_then_arrival_order() -> None:
    sim = Sim(num_blocks=100, block_size=4)
    seqs = [sim.add(prompt(3, 10 * i), 5, priority=p) for i, p in enumerate([2, 0, 1, 0])]
    batch = sim.step()
    assert batch.seqs == [seqs[1], seqs[3], seqs[2], seqs[0]]


# ---- preemption ------------------------------------------------------------------------------


def test_preemption_picks_the_lowest_priority_running_sequence_not_just_the_newest() -> None:
    sim = Sim(num_blocks=4, block_size=4)
    a = sim.add(prompt(3, 100), 10, priority=0)
    low = sim.add(prompt(3, 200), 10, priority=1)
    b = sim.add(prompt(3, 300), 10, priority=0)  # newest, but outranks `low`
    sim.step()
    sim.step()
    assert sim.preempted == []
    batch = sim.step()  # all three cross into a second block; only one is free
    assert batch.preempted == [low] and batch.seqs == [a, b]
    assert low.status is Status.WAITING and low.num_preemptions == 1
    sim.run()
    sim.assert_drained()


def test_tiny_pool_preempts_and_everything_still_completes() -> None:
    sim = Sim(num_blocks=6, block_size=4, max_num_batched_tokens=32)
    for i in range(8):
        sim.add(prompt(10, 50 * i), 12, priority=i % 3)
    sim.run()
    assert sim.sched.num_preemptions > 0 and sim.preempted
    sim.assert_drained()
    for req in sim.requests.values():
        seq = req.seq
        expect = [fake_token(seq, n) for n in range(seq.num_prompt_tokens, seq.num_tokens)]
        assert seq.output_token_ids == expect


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_a_pool_that_fits_one_maximal_sequence_completes_twenty_of_them(block_size: int) -> None:
    rng = random.Random(block_size)
    max_prompt, max_tokens = 60, 20
    pool = blocks_for_one(block_size, max_prompt, max_tokens)
    sim = Sim(num_blocks=pool, block_size=block_size, max_num_seqs=8, max_num_batched_tokens=48)
    for i in range(20):
        p = max_prompt if i % 2 == 0 else rng.randint(1, max_prompt)
        sim.add(prompt(p, 100 * i), max_tokens if i % 3 else rng.randint(1, max_tokens),
                priority=rng.randint(0, 2))
    sim.run(max_steps=sum(r.work for r in sim.requests.values()))
    sim.assert_drained()


def test_prompt_too_large_for_the_pool_is_refused() -> None:
    sim = Sim(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="do not fit the KV pool"):
        sim.add(prompt(16), 1)  # 16 tokens fill the pool; the first sample has no room
    sim.add(prompt(15), 1)
    sim.run()
    sim.assert_drained()


def test_aborting_waiting_and_running_sequences_frees_their_blocks() -> None:
    sim = Sim(num_blocks=10, block_size=4, max_num_seqs=2)
    running = [sim.add(prompt(9, 100 * i), 30) for i in range(2)]
    waiting = sim.add(prompt(9, 900), 30)
    sim.step()
    assert waiting.status is Status.WAITING
    sim.abort(running[0])
    sim.abort(waiting)
    assert sim.bm.num_free_blocks == 10 - 3
    sim.step()
    sim.abort(running[1])
    sim.abort(running[1])  # twice is harmless
    sim.assert_drained()


# ---- prefix sharing across a workload -------------------------------------------------------


def run_chat_workload(prefix_caching: bool) -> Sim:
    rng = random.Random(7)
    system = prompt(200, 5000)
    sim = Sim(num_blocks=200, block_size=16, max_num_seqs=4, max_num_batched_tokens=128,
              prefix_caching=prefix_caching)
    for i in range(12):
        sim.add(system + prompt(rng.randint(1, 40), 10_000 + 100 * i), rng.randint(1, 30))
    sim.run()
    return sim


def test_shared_system_prompt_hits_the_cache_and_changes_no_output() -> None:
    cold, warm = run_chat_workload(False), run_chat_workload(True)
    assert cold.bm.stats.hits == 0 and cold.sched.num_preemptions == warm.sched.num_preemptions == 0
    assert warm.bm.stats.hits >= 8 * 192  # most requests skip the 12 full system-prompt blocks
    assert warm.tokens_computed == cold.tokens_computed - warm.bm.stats.hits
    assert warm.steps <= cold.steps
    for c, w in zip(cold.requests.values(), warm.requests.values(), strict=True):
        assert w.seq.token_ids == c.seq.token_ids
    cold.assert_drained()
    warm.assert_drained()


def test_finished_request_still_reports_the_prompt_tokens_it_took_from_the_cache() -> None:
    sim = Sim(num_blocks=100, block_size=16, max_num_batched_tokens=64)
    system = prompt(200, 5000)
    sim.add(system + [1], 3)
    sim.run()
    seq = sim.add(system + [2], 3)
    sim.step()
    assert seq.num_cached_tokens == 192  # the 12 full system-prompt blocks, at admission
    sim.run()
    assert seq.num_cached_tokens == 192  # what EngineCore puts in the final RequestOutput


# ---- randomized workloads --------------------------------------------------------------------


def random_workload(seed: int, staggered: bool) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    n = rng.randint(1, 12)
    bases = [prompt(300, 10_000 * (k + 1)) for k in range(3)]  # prompts share prefixes of these
    specs = []
    for _ in range(n):
        length = rng.randint(1, 300)
        shared = rng.choice([0, rng.randint(0, length)])
        body = rng.choice(bases)[:shared] + [rng.randrange(1000) for _ in range(length - shared)]
        specs.append((body, rng.randint(1, 50), rng.randint(0, 3)))
    one = max(blocks_for_one(block_size, len(p), m) for p, m, _ in specs)
    plenty = sum(-(-(len(p) + m) // block_size) for p, m, _ in specs)
    num_blocks = rng.choice([one, one + rng.randint(0, one), rng.randint(one, max(one, plenty)), plenty])
    budget = rng.choice([1, 2, 5, 16, 64, 512, rng.randint(1, 512)])
    sim = Sim(num_blocks, block_size, max_num_seqs=rng.randint(1, 16), max_num_batched_tokens=budget,
              prefix_caching=rng.random() < 0.8)
    abort_rate = rng.choice([0.0, 0.0, 0.01, 0.05])
    pending = list(specs)
    if not staggered:
        for p, m, prio in pending:
            sim.add(p, m, prio)
        pending = []
    total_work = sum(len(p) + m for p, m, _ in specs)
    while sim.sched.has_unfinished() or pending:
        if pending and (rng.random() < 0.1 or not sim.sched.has_unfinished()):
            sim.add(*pending.pop(0))
        sim.step()
        if rng.random() < abort_rate and sim.unfinished():
            sim.abort(rng.choice(sim.unfinished()))
        assert sim.steps <= 2 * total_work + 100 * n, f"seed {seed}: the workload does not finish"
    sim.assert_drained()
    reqs = [r for r in sim.requests.values() if not r.aborted]
    if staggered:  # a newcomer waits at most for everyone's whole work
        for r in reqs:
            assert r.finished_step - r.added_step <= total_work, f"seed {seed}: {r.seq.request_id} starved"
    else:  # whoever outranks a request runs ahead of it, everyone else only in its shadow
        for r in reqs:
            ahead = sum(o.work for o in sim.requests.values() if o.seq.sort_key <= r.seq.sort_key)
            assert r.finished_step <= ahead, f"seed {seed}: {r.seq.request_id} starved"


@pytest.mark.parametrize("seed", range(40))
def test_random_workload_frees_every_block_and_starves_no_one(seed: int) -> None:
    random_workload(seed, staggered=False)


@pytest.mark.parametrize("seed", range(100, 120))
def test_random_staggered_workload_frees_every_block_and_starves_no_one(seed: int) -> None:
    random_workload(seed, staggered=True)


def test_prompts_sharing_a_prefix_admitted_together_compute_it_once():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=512)
    system = list(range(100, 112))  # three full blocks shared by everyone
    seqs = [Sequence(f"s{i}", system + [i, i + 1]) for i in range(3)]
    other = Sequence("other", list(range(300, 310)))
    for s in (*seqs, other):
        sched.add(s)
    first = sched.schedule()
    # the leader computes the shared blocks; the followers wait a step; unrelated work goes ahead
    assert [s.request_id for s in first.seqs] == ["s0", "other"]
    sched.update(first)
    second = sched.schedule()
    assert [s.request_id for s in second.seqs[-2:]] == ["s1", "s2"]
    assert all(s.num_cached_tokens == 12 for s in seqs[1:])  # served by the cache
    assert second.num_new_tokens[-2:] == [2, 2]
