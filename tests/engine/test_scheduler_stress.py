"""The real engine under adversarial, seeded scheduling on the CPU (a tiny random-weight Llama).

Requests arrive at different steps into a KV pool small enough to force preemption and
recomputation, with a token budget small enough to chunk most prompts; prompts share prefixes
(some under different cache salts, some identical across salts), have lengths on and off block
boundaries, ask for 1 to 40 tokens, stop on strings, stop token ids or EOS, sample greedily or
with a seed, have priorities; and requests are aborted while waiting, mid-prefill, decoding and
preempted (LLMEngine.abort_request, step by step; AsyncLLM.abort and streams left early). Checked:

- every request's tokens, text and finish equal those of the same request run alone (an engine
  with no prefix cache and a zeroed pool, i.e. nothing from another run to reuse); greedy tokens
  may part only at a true near-tie of the solo run's logits, since batching changes the float
  rounding; an aborted request's tokens are a prefix of its solo run;
- on every step: no sequence reads K/V that is not its own prefix's (same cache salt, same tokens
  before it) and nothing writes into a shared or cached block; reference counts, the free list,
  the prefix-cache map and each sequence's chained block keys (rooted at its own salt) agree;
- at the end every block is free with ref count zero and the prefix-cache map points only at
  free blocks that carry its key; no request hangs (bounded steps; timeouts for AsyncLLM);
- streams: exactly one finished output, last; deltas add up to the final tokens and text; the
  engine's generated-token count equals the tokens handed out.

`n > 1` is not a SamplingParams option in this engine, so it is not exercised.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, replace

import pytest
import torch

from engine import LLM, AsyncLLM, SamplingParams
from engine.block_manager import BlockManager, block_key, salt_key
from engine.engine_core import LLMEngine
from engine.outputs import RequestOutput
from engine.scheduler import Scheduler
from engine.sequence import Sequence, Status
from tests.helpers.hf_reference import build_tiny_checkpoint

VOCAB = 384
EOS = 2  # LlamaConfig's default eos_token_id, written to the folder's config.json
NEAR_TIE = 1e-4


def char(token: int) -> str:
    """The text of a token of the test tokenizer: one CJK character each, so text maps back to
    tokens one to one and a stop string made of tokens' characters matches at token edges."""
    return chr(0x4E00 + token)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """This module's steps are a tiny model's: too small to split across threads. With two, each
    op waits for the other thread, and on a machine whose cores are busy with other work that made
    the module 7x slower (130 s instead of 18 s); one thread does not care."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    from tokenizers import Tokenizer, decoders, models

    path = build_tiny_checkpoint("llama", tmp_path_factory.mktemp("stress"))
    tok = Tokenizer(models.WordLevel({char(i): i for i in range(VOCAB)}, unk_token=char(0)))
    tok.decoder = decoders.Fuse()  # decode = the characters joined, nothing in between
    tok.save(str(path / "tokenizer.json"))
    return str(path)


def pool_gib(blocks: int, block_size: int) -> float:
    """kv_cache_gib giving the tiny model exactly `blocks` blocks (2 layers, 2 KV heads of 16,
    K and V, float32)."""
    return (blocks + 0.5) * block_size * 2 * 2 * 2 * 16 * 4 / 2**30


# ---- solo reference runs ---------------------------------------------------------------------


class Solo:
    """Each request run alone. One engine serves them all, with no prefix cache and its pool
    zeroed before each run, so no run can reuse anything of another (as in a fresh engine)."""

    def __init__(self, folder: str) -> None:
        self.llm = LLM(folder, kv_cache_gib=pool_gib(128, 16), enable_prefix_caching=False)
        self._runs: dict[tuple, RequestOutput] = {}
        self.near_ties = 0  # greedy runs that parted from their solo run at a near-tie

    def run(self, prompt: list[int], params: SamplingParams) -> RequestOutput:
        key = (tuple(prompt), repr(params))
        if key not in self._runs:
            for cache in self.llm.engine.runner.kv_caches:
                cache.zero_()
            self._runs[key] = self.llm.generate([prompt], params)[0]
        return self._runs[key]

    def assert_prefix_of(self, what: str, prompt: list[int], params: SamplingParams,
                         ours: list[int], theirs: list[int]) -> bool:
        """`ours` equals the start of `theirs` (the solo tokens). Greedy tokens may part where
        the solo run's top two logits are a true near-tie (then False); seeded samples may not."""
        for k, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            if a == b:
                continue
            assert params.greedy, f"{what}: seeded sample {k} is {a}, alone {b}\n{ours}\n{theirs}"
            logits = self.llm.engine.runner.prefill_logits(prompt + theirs[:k])[-1]
            top = logits.topk(2)
            gap = float(top.values[0] - top.values[1])
            assert gap < NEAR_TIE and a in top.indices.tolist(), (
                f"{what}: greedy token {k} is {a}, alone {b} (solo top-2 gap {gap:.3g}, not a "
                f"near-tie)\nours  {ours}\nalone {theirs}")
            self.near_ties += 1
            return False
        assert len(ours) <= len(theirs), f"{what}: {len(ours)} tokens, alone {len(theirs)}"
        return True


@pytest.fixture(scope="module")
def solo(folder) -> Solo:
    return Solo(folder)


# ---- workloads -------------------------------------------------------------------------------


@dataclass(eq=False)
class Spec:
    rid: str
    prompt: list[int]
    params: SamplingParams
    salt: str | None
    priority: int
    arrive: int  # the step (engine tests) or the millisecond (AsyncLLM test) it is sent


def make_workload(rng: random.Random, solo: Solo, n: int, block_size: int,
                  arrive_span: int) -> list[Spec]:
    bases = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 5) * block_size + rng.randint(0, 3))]
             for _ in range(3)]
    specs: list[Spec] = []
    for i in range(n):
        kind = rng.random()
        if specs and kind < 0.2:  # the very prompt of an earlier request, maybe under another salt
            prompt = list(rng.choice(specs).prompt)
        else:
            length = rng.choice([1, block_size, 2 * block_size, 3 * block_size + 1, 2 * block_size - 1,
                                 rng.randint(2, 6 * block_size)])
            if kind < 0.75:  # a shared system prompt (all of it, or part), then its own text
                base = rng.choice(bases)
                head = base[: rng.choice([len(base), rng.randint(1, len(base))])]
                prompt = head + [rng.randrange(1, VOCAB) for _ in range(max(1, length - len(head)))]
            else:
                prompt = [rng.randrange(1, VOCAB) for _ in range(length)]
        max_tokens = rng.choice([1, 1, 2, 7, 16, 24, 40])
        if rng.random() < 0.8:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        else:
            params = SamplingParams(temperature=0.8, top_k=40, seed=rng.randrange(1 << 30),
                                    max_tokens=max_tokens)
        params.ignore_eos = rng.random() < 0.6
        stop_kind = rng.random()
        if stop_kind < 0.45:  # stop on a string or a token the request produces (or may)
            alone = solo.run(prompt, params).token_ids
            j = rng.randrange(len(alone))
            if stop_kind < 0.3:
                stop = char(alone[j]) + (char(alone[j + 1]) if j + 1 < len(alone)
                                         and rng.random() < 0.5 else "")
                params = replace(params, stop=[stop, "zz"],
                                 include_stop_str_in_output=rng.random() < 0.5)
            else:
                params = replace(params, stop_token_ids=[alone[j]])
        specs.append(Spec(f"r{i}", prompt, params, rng.choice([None, "ann", "bob"]),
                          rng.randint(0, 2), rng.randint(0, arrive_span)))
    specs.sort(key=lambda s: s.arrive)
    return specs


# ---- invariants ------------------------------------------------------------------------------


def prefix_ids(seq: Sequence, salt: str | None) -> list[int]:
    """For each position, an id of (cache salt, every token up to and including it): what the
    K/V written at that position depends on, and who may read it."""
    ids, h = [], hash(("salt", salt))
    for t in seq.token_ids:
        h = hash((h, t))
        ids.append(h)
    return ids


class Checker:
    """Watches one LLMEngine: a shadow of what each KV slot holds, checked before every model
    step, and the pool's bookkeeping, checked after every step and abort."""

    def __init__(self, engine: LLMEngine, salts: dict[str, str | None]) -> None:
        self.engine = engine
        self.salts = salts  # request id -> the cache salt the test gave it
        self.bm = engine.block_manager
        self.shadow: dict[int, int] = {}  # slot -> prefix id of the token whose K/V it holds
        self.chunks = 0  # prompt chunks that stopped short of the end
        self.steps = 0
        real_execute = engine.runner.execute

        def execute(batch):
            self.before_execute(batch)
            return real_execute(batch)

        engine.runner.execute = execute

    def before_execute(self, batch) -> None:
        bs, blocks = self.bm.block_size, self.bm.blocks
        writes: dict[int, int] = {}
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            ids = prefix_ids(seq, self.salts[seq.request_id])
            start = seq.num_computed_tokens
            assert n >= 1 and start + n <= seq.num_tokens
            assert len(seq.block_table) == self.bm.blocks_needed(start + n)
            for p in range(start):  # what it attends to: its own prefix, computed earlier
                slot = seq.block_table[p // bs] * bs + p % bs
                assert self.shadow.get(slot) == ids[p], (
                    f"{seq.request_id} attends at position {p} to K/V that is not its own prefix's")
            for p in range(start, start + n):
                block = blocks[seq.block_table[p // bs]]
                assert block.ref_count == 1 and block.hash is None, (
                    f"{seq.request_id} writes position {p} into a shared or cached block")
                slot = block.id * bs + p % bs
                assert slot not in writes, "two tokens written to one slot in a step"
                writes[slot] = ids[p]
            if start + n < seq.num_tokens:
                self.chunks += 1
        self.shadow.update(writes)
        self.steps += 1

    def check_pool(self) -> None:
        engine, bm = self.engine, self.bm
        sched = engine.scheduler
        waiting = [s for _, s in sched.waiting]
        live = waiting + sched.running
        assert sorted(s.request_id for s in live) == sorted(engine._requests)
        assert all(s.status is Status.WAITING for s in waiting)
        assert all(s.status is Status.RUNNING for s in sched.running)
        assert len(sched.running) <= engine.config.max_num_seqs
        refs = [0] * bm.num_blocks
        for seq in live:
            for b in seq.block_table:
                refs[b] += 1
        assert [b.ref_count for b in bm.blocks] == refs
        assert len(bm._free) == len(set(bm._free)) == refs.count(0)
        assert all(refs[b] == 0 for b in bm._free)
        for seq in waiting:
            assert seq.block_table == [] and seq.block_hashes == [] and seq.num_computed_tokens == 0
        for seq in sched.running:
            assert len(seq.block_table) == bm.blocks_needed(seq.num_computed_tokens)
            assert seq.cache_root == salt_key(self.salts[seq.request_id])
            if not bm.enable_prefix_caching:
                continue
            # The chained keys of its full blocks start at its own salt; a cached block it holds
            # carries exactly its key (so it holds no block cached under another salt or prefix).
            full = min(seq.num_computed_tokens, seq.num_tokens) // bm.block_size
            assert len(seq.block_hashes) == full
            parent = seq.cache_root
            for i in range(full):
                tokens = seq.token_ids[i * bm.block_size : (i + 1) * bm.block_size]
                parent = block_key(parent, tokens)
                assert seq.block_hashes[i] == parent, f"{seq.request_id}: block {i}'s key"
                block = bm.blocks[seq.block_table[i]]
                if block.hash is not None:
                    assert block.hash == parent and block.token_ids == tuple(tokens)
        self.check_cache_map()

    def check_cache_map(self) -> None:
        bm = self.bm
        for key, b in bm._cached.items():
            assert bm.blocks[b].hash == key and len(bm.blocks[b].token_ids) == bm.block_size
        assert sorted(bm._cached.values()) == sorted(b.id for b in bm.blocks if b.hash is not None)

    def check_drained(self) -> None:
        engine, bm = self.engine, self.bm
        assert not engine.has_unfinished_requests() and not engine._requests
        assert not engine.scheduler.running and not engine.scheduler.waiting
        assert all(b.ref_count == 0 for b in bm.blocks)
        assert bm.num_free_blocks == bm.num_blocks and sorted(bm._free) == list(range(bm.num_blocks))
        self.check_cache_map()  # and since every block is free, every cached one is too
        stats = engine.stats()
        assert stats["num_running"] == stats["num_waiting"] == 0 and stats["kv_usage"] == 0


def idle(stats: dict) -> bool:
    """What AsyncLLM.stats() says once its engine has nothing left to do."""
    return stats["num_running"] == stats["num_waiting"] == 0 and stats["kv_usage"] == 0


def classify(seq: Sequence) -> str:
    if seq.status is Status.WAITING:
        return "preempted" if seq.num_preemptions else "waiting"
    return "prefill" if seq.num_computed_tokens < seq.num_prompt_tokens else "decode"


def check_stream(what: str, outs: list[RequestOutput], prompt: list[int]) -> RequestOutput:
    assert outs, f"{what}: no output"
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True], f"{what}: finishes"
    final = outs[-1]
    assert final.prompt_token_ids == prompt
    assert [t for o in outs for t in o.delta_token_ids] == final.token_ids, f"{what}: token deltas"
    assert "".join(o.delta_text for o in outs) == final.text, f"{what}: text deltas"
    return final


def check_against_solo(solo: Solo, spec: Spec, final: RequestOutput, block_size: int) -> bool:
    """Returns whether the request was aborted. Outputs must match the solo run."""
    what = f"{spec.rid} (salt {spec.salt}, {len(spec.prompt)} prompt tokens, {spec.params})"
    alone = solo.run(spec.prompt, spec.params)
    assert final.num_cached_tokens % block_size == 0 and final.num_cached_tokens < len(spec.prompt)
    same = solo.assert_prefix_of(what, spec.prompt, spec.params, final.token_ids, alone.token_ids)
    if final.finish_reason == "abort":
        assert len(final.token_ids) < (spec.params.max_tokens or 1 << 30)
        return True
    if same:  # unless it parted at a near-tie: then nothing after can be compared
        assert final.token_ids == alone.token_ids, f"{what}: {final.token_ids} vs {alone.token_ids}"
        assert (final.text, final.finish_reason, final.stop_reason) == (
            alone.text, alone.finish_reason, alone.stop_reason), what
    if final.finish_reason == "length":
        assert len(final.token_ids) == spec.params.max_tokens, what
    else:
        assert final.finish_reason == "stop" and len(final.token_ids) <= spec.params.max_tokens
        if isinstance(final.stop_reason, int):
            assert final.token_ids[-1] == final.stop_reason
            assert final.stop_reason in spec.params.stop_token_ids or (
                final.stop_reason == EOS and not spec.params.ignore_eos)
        else:
            assert final.stop_reason in spec.params.stop
    return False


# ---- defects the stress runs found, each pinned down alone ------------------------------------


def test_a_preempted_request_reports_only_the_prompt_tokens_the_cache_served_it():
    """Found by the stress runs: a request preempted after some output was recomputed largely
    from the cache, output tokens included, and its RequestOutput.num_cached_tokens ("prompt
    tokens served by the prefix cache") became that recomputation's hit: 8 for a 2-token prompt."""
    bm = BlockManager(num_blocks=6, block_size=4)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64)
    a, b = Sequence("a", [1, 2]), Sequence("b", [3, 4])
    sched.add(a)
    sched.add(b)
    while not b.num_preemptions:  # both decode until a needs b's blocks (at 13 tokens each)
        batch = sched.schedule()
        sched.update(batch)
        for seq in batch.seqs:
            seq.token_ids.append(100 + len(seq.token_ids))
    assert b.num_tokens == 13 and b.num_cached_tokens == 0
    asked = (bm.stats.queries, bm.stats.hits)
    sched.finish(a)
    assert sched.schedule().seqs == [b]
    assert b.num_computed_tokens == 8  # its recomputation took 2 blocks from the cache (a took one)
    assert b.num_cached_tokens == 0  # but none of its 2 prompt tokens came from there at admission
    # Nor does the hit ratio (/metrics) count it: it would rise with memory pressure alone.
    assert (bm.stats.queries, bm.stats.hits) == asked == (4, 0)


# ---- the step-driven stress runs --------------------------------------------------------------

# (block_size, max_num_batched_tokens, max_num_seqs): each seed draws its pool size and workload.
CONFIGS = [(4, 7, 8), (16, 16, 64), (8, 11, 4), (1, 5, 16), (4, 24, 6), (16, 9, 3)]
ABORT_KINDS = ("waiting", "prefill", "decode", "preempted")


def stress(folder: str, solo: Solo, seed: int) -> Counter:
    rng = random.Random(seed)
    block_size, budget, max_seqs = CONFIGS[seed % len(CONFIGS)]
    specs = make_workload(rng, solo, rng.randint(20, 28), block_size, arrive_span=40)
    by_id = {s.rid: s for s in specs}
    # Room for the largest request alone (and its first sample), and at most a quarter more.
    one = max(-(-(len(s.prompt) + (s.params.max_tokens or 0) + 1) // block_size) for s in specs)
    num_blocks = one + rng.randint(0, one // 4)
    llm = LLM(folder, kv_cache_gib=pool_gib(num_blocks, block_size), block_size=block_size,
              max_num_batched_tokens=budget, max_num_seqs=max_seqs)
    engine = llm.engine
    assert engine.block_manager.num_blocks == num_blocks
    checker = Checker(engine, {s.rid: s.salt for s in specs})
    outs: dict[str, list[RequestOutput]] = {s.rid: [] for s in specs}
    # Abort while a request is in each state: up to two of each, not before a drawn step.
    quota = dict.fromkeys(ABORT_KINDS, 2)
    not_before = {k: rng.randint(0, 30) for k in ABORT_KINDS}
    aborted: Counter = Counter()
    pending = list(specs)
    work = sum(len(s.prompt) + (s.params.max_tokens or 0) for s in specs)
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].arrive <= step:
            s = pending.pop(0)
            engine.add_request(s.rid, s.prompt, s.params, s.priority, cache_salt=s.salt)
        live = list(engine.scheduler.running) + [s for _, s in engine.scheduler.waiting]
        rng.shuffle(live)
        for seq in live:
            kind = classify(seq)
            if quota[kind] and step >= not_before[kind] and rng.random() < 0.1:
                quota[kind] -= 1
                aborted[kind] += 1
                out = engine.abort_request(seq.request_id)
                assert out is not None and out.finish_reason == "abort"
                outs[seq.request_id].append(out)
                assert engine.abort_request(seq.request_id) is None  # a second abort: nothing
                checker.check_pool()
        for out in engine.step():
            assert not outs[out.request_id] or not outs[out.request_id][-1].finished
            outs[out.request_id].append(out)
        checker.check_pool()
        step += 1
        assert step <= 4 * work + 200, f"seed {seed}: the workload does not finish"
    checker.check_drained()
    assert engine.abort_request("r0") is None and engine.abort_request("nobody") is None

    generated = 0
    finishes: Counter = Counter()
    for rid, stream in outs.items():
        spec = by_id[rid]
        final = check_stream(f"seed {seed} {rid}", stream, spec.prompt)
        assert all(len(o.delta_token_ids) == 1 for o in stream if o.finish_reason != "abort")
        if check_against_solo(solo, spec, final, block_size):
            finishes["abort"] += 1
        else:
            finishes[final.finish_reason] += 1
            if final.finish_reason == "stop":
                finishes["stop-token" if isinstance(final.stop_reason, int) else "stop-string"] += 1
        generated += len(final.token_ids)
    assert generated == engine.num_generated_tokens  # nothing sampled twice or lost
    stats = engine.stats()
    return Counter(preemptions=stats["num_preemptions"], hits=stats["prefix_cache_hits"],
                   chunks=checker.chunks, steps=checker.steps,
                   **{f"abort-{k}": v for k, v in aborted.items()}, **finishes)


_SEEN: dict[int, Counter] = {}  # seed -> what its run covered (the runs are deterministic)


def stress_once(folder: str, solo: Solo, seed: int) -> Counter:
    if seed not in _SEEN:
        _SEEN[seed] = stress(folder, solo, seed)
    return _SEEN[seed]


SEEDS = range(2 * len(CONFIGS))


@pytest.mark.parametrize("seed", SEEDS)
def test_adversarial_schedule_matches_solo_runs_and_frees_every_block(folder, solo, seed):
    seen = stress_once(folder, solo, seed)
    # Each run really is adversarial: the pool forced preemption, prompts were chunked and
    # shared cached prefixes, and requests were aborted.
    assert seen["preemptions"] > 0 and seen["chunks"] > 0 and seen["hits"] > 0, seen
    assert sum(seen[f"abort-{k}"] for k in ABORT_KINDS) >= 2, seen


def test_every_abort_state_and_finish_kind_occurs_across_the_seeds(folder, solo):
    # Which state an abort meets depends on the run, so their coverage is checked over all the
    # seeds (each run once: they are deterministic, and the previous test ran them already).
    total = sum((stress_once(folder, solo, seed) for seed in SEEDS), Counter())
    for kind in ABORT_KINDS:
        assert total[f"abort-{kind}"] > 0, total
    assert total["length"] and total["stop-string"] and total["stop-token"], total


def test_identical_prompts_under_three_salts_share_blocks_only_within_their_salt(folder, solo):
    """Six copies of one prompt, two per salt (one None), all arriving together in a pool that
    fits all of them: the second of each salt is served from the cache, never the first."""
    bs = 4
    prompt = random.Random(5).choices(range(1, VOCAB), k=6 * bs + 1)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    llm = LLM(folder, kv_cache_gib=pool_gib(64, bs), block_size=bs, max_num_batched_tokens=256)
    order = ["ann", "bob", None, "ann", None, "bob"]
    checker = Checker(llm.engine, {f"s{i}": salt for i, salt in enumerate(order)})
    for i, salt in enumerate(order):
        llm.engine.add_request(f"s{i}", prompt, params, cache_salt=salt)
    finals = {}
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            finals[out.request_id] = out
        checker.check_pool()
    checker.check_drained()
    alone = solo.run(prompt, params)
    assert all(o.token_ids == alone.token_ids for o in finals.values())
    assert [finals[f"s{i}"].num_cached_tokens for i in range(6)] == [0, 0, 0, 6 * bs, 6 * bs, 6 * bs]


# ---- AsyncLLM: the same through streams, with aborts from other tasks -------------------------


async def test_async_streams_with_aborts_match_solo_runs_and_free_every_block(folder, solo):
    rng = random.Random(99)
    bs = 4
    specs = make_workload(rng, solo, 20, bs, arrive_span=20)  # arrive: milliseconds
    one = max(-(-(len(s.prompt) + (s.params.max_tokens or 0) + 1) // bs) for s in specs)
    llm = AsyncLLM(folder, kv_cache_gib=pool_gib(one, bs), block_size=bs,
                   max_num_batched_tokens=10, max_num_seqs=8)
    engine = llm.engine
    # Runs on the step thread; a failure there ends every stream with EngineDeadError.
    checker = Checker(engine, {s.rid: s.salt for s in specs})
    real_step = engine.step

    def step():
        outputs = real_step()
        checker.check_pool()
        return outputs

    engine.step = step
    # How each stream ends: reads to the end, aborts itself after k outputs, leaves after k
    # outputs, or is aborted by another task after a delay (maybe before it is even added).
    modes = [(rng.choice(["end", "end", "self", "leave", "killed"]), rng.randint(1, 6)) for _ in specs]

    async def client(spec: Spec, mode: str, k: int) -> list[RequestOutput]:
        await asyncio.sleep(spec.arrive / 1000)
        outs = []
        stream = llm.generate(spec.prompt, spec.params, spec.rid, priority=spec.priority,
                              cache_salt=spec.salt)
        async for out in stream:
            outs.append(out)
            if len(outs) == k and mode == "self":
                await llm.abort(spec.rid)
            if len(outs) == k and mode == "leave":
                break
        await stream.aclose()
        return outs

    async def killer(spec: Spec, k: int) -> None:
        await asyncio.sleep((spec.arrive + 3 * k) / 1000)
        await llm.abort(spec.rid)

    try:
        tasks = [client(s, m, k) for s, (m, k) in zip(specs, modes, strict=True)]
        tasks += [killer(s, k) for s, (m, k) in zip(specs, modes, strict=True) if m == "killed"]
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        # The aborts of streams that left travel through the queue. The step thread publishes
        # the engine's counts (llm.stats()) after each step or abort it ran: once they show
        # nothing running, waiting or holding a block, it has done all it had to and waits for
        # a command, and its state can be read here. One that never drains (a leaked block)
        # runs to the deadline, and check_drained says what is left.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (engine.has_unfinished_requests()
                                               or not idle(llm.stats())):
            await asyncio.sleep(0.01)
        checker.check_drained()
        endings: Counter = Counter()
        for spec, (mode, k), outs in zip(specs, modes, results[: len(specs)], strict=True):
            if mode == "leave" and not outs[-1].finished:
                assert len(outs) == k
                solo.assert_prefix_of(spec.rid, spec.prompt, spec.params, outs[-1].token_ids,
                                      solo.run(spec.prompt, spec.params).token_ids)
                endings["left"] += 1
                continue
            final = check_stream(spec.rid, outs, spec.prompt)
            aborted = check_against_solo(solo, spec, final, bs)
            if aborted:
                assert mode in ("self", "killed"), f"{spec.rid} ({mode}) was aborted"
            endings["abort" if aborted else final.finish_reason] += 1
        assert endings["abort"] and endings["length"], endings
        assert engine.stats()["num_preemptions"] > 0 and checker.chunks > 0
    finally:
        llm.shutdown()
