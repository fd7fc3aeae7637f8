"""Where one batch-1 decode step's time goes: wall-clock timers around the engine's parts.

    python bench/decode_profile.py [--quantization auto] [--prompt 512] [--gen 128] [--runs 5]

    python bench/decode_profile.py --threads 1 --clock cpu   # on a machine shared with other jobs

Loads `LLM(quantization=...)` on the embedded model, prefills one prompt, then decodes `gen`
tokens `runs` times (the prompt cached); each part's time is summed over a run's decode steps and
divided by their count, and the table prints the median over the runs. The timers wrap the
modules' and the engine's methods on their instances (about 0.2 us each, ~300 per step), so the
parts add up to the step: "other model ops" is the model's forward less its timed parts (embedding,
split and views of qkv, SiLU-and-mul), "runner, rest of execute" is execute() less the forward,
logits and sampler (the read of the sampled token, per-request lists), "engine, rest of step"
the step less schedule, execute, update and detokenization (outputs, metrics).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from single_stream import make_prompt

LINEAR_KINDS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


class Timers:
    def __init__(self, clock=time.perf_counter) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.clock = clock

    def wrap(self, obj, attr: str, key: str) -> None:
        """Time every call of obj.attr (an instance attribute shadows the class's method)."""
        fn = getattr(obj, attr)
        total, clock = self.total, self.clock

        def timed(*args, **kwargs):
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                total[key] += clock() - t

        setattr(obj, attr, timed)


def native_decode_ops():
    """The engine's native decode ops (None: off, or an engine without them)."""
    try:
        from engine.native import decode_ops
    except ImportError:
        return None
    return decode_ops.get()


def instrument(llm, clock) -> Timers:
    from engine.layers.norm import RMSNorm
    from engine.layers.rotary import RotaryEmbedding

    timers = Timers(clock)
    engine = llm.engine
    runner = engine.runner
    model = runner.model
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in LINEAR_KINDS:
            timers.wrap(module, "forward", f"linear {leaf}")
        elif isinstance(module, RMSNorm):
            timers.wrap(module, "forward", "RMSNorm (+ residual add)")
        elif isinstance(module, RotaryEmbedding):
            timers.wrap(module, "forward", "RoPE")
            timers.wrap(module, "rows", "RoPE")
            if hasattr(module, "rotate_heads"):  # q and k as one tensor (an engine before: no)
                timers.wrap(module, "rotate_heads", "RoPE")
    timers.wrap(runner.backend, "forward", "attention (KV write + SDPA)")
    ops = native_decode_ops()
    if ops is not None:  # the CPU decode path calls them directly (RoPE: in the attention call)
        for name, key in (("add_rms_norm", "RMSNorm (+ residual add)"), ("rope_kv_write", "RoPE"),
                          ("decode_attention", "attention (KV write + SDPA)"),
                          ("rope_write_attend", "attention (KV write + SDPA)")):
            timers.wrap(ops, name, key)
    timers.wrap(model, "forward", "_model")
    timers.wrap(runner, "_forward", "_runner_forward")
    timers.wrap(runner, "execute", "_execute")
    runner.sampler = _CallWrapper(runner.sampler, timers, "sampler")
    timers.wrap(engine.scheduler, "schedule", "scheduler.schedule")
    timers.wrap(engine.scheduler, "update", "scheduler.update")
    timers.wrap(engine, "step", "_step")
    return timers


class _CallWrapper:
    """Times calls of a callable object (`obj()` looks __call__ up on the type, not the instance)."""

    def __init__(self, obj, timers: Timers, key: str) -> None:
        self.obj, self.timers, self.key = obj, timers, key

    def __call__(self, *args, **kwargs):
        clock = self.timers.clock
        t = clock()
        try:
            return self.obj(*args, **kwargs)
        finally:
            self.timers.total[self.key] += clock() - t


def wrap_detokenizers(engine, timers: Timers) -> None:
    for req in engine._requests.values():  # noqa: SLF001 - a bench reaching into the engine
        if req.detokenizer is not None:
            timers.wrap(req.detokenizer, "add", "detokenization")
            timers.wrap(req.detokenizer, "take_delta", "detokenization")


def profile_run(llm, timers: Timers, prompt: list[int], gen: int) -> tuple[dict[str, float], int]:
    """Decode `gen` tokens after `prompt`; per-step ms of each part over the decode steps."""
    from engine import SamplingParams

    engine = llm.engine
    engine.add_request("profile", prompt, SamplingParams(temperature=0.0, max_tokens=gen,
                                                         ignore_eos=True))
    wrap_detokenizers(engine, timers)
    engine.step()  # the prefill (a cached prompt: its last block) and the first token
    timers.total.clear()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return {k: v * 1e3 / steps for k, v in timers.total.items()}, steps


def table(per_step: dict[str, float]) -> list[tuple[str, float]]:
    """The parts as rows, the derived remainders included; the last row is the whole step."""
    t = dict(per_step)
    timed_model = sum(v for k, v in t.items() if k.startswith(("linear", "RMSNorm", "RoPE", "attention"))
                      and k != "linear lm_head")
    rows = [(f"linear {k}", t.get(f"linear {k}", 0.0)) for k in LINEAR_KINDS]
    rows += [(k, t.get(k, 0.0)) for k in ("attention (KV write + SDPA)", "RMSNorm (+ residual add)", "RoPE")]
    rows.append(("other model ops (embedding, qkv split/views, SiLU-and-mul)", t["_model"] - timed_model))
    rows.append(("sampler", t.get("sampler", 0.0)))
    rows.append(("runner input building (_forward less the model)", t["_runner_forward"] - t["_model"]))
    rest = t["_execute"] - t["_runner_forward"] - t.get("linear lm_head", 0.0) - t.get("sampler", 0.0)
    rows.append(("runner, rest of execute (token read, per-request lists)", rest))
    rows += [(k, t.get(k, 0.0)) for k in ("scheduler.schedule", "scheduler.update", "detokenization")]
    engine_rest = (t["_step"] - t["_execute"] - t.get("scheduler.schedule", 0.0)
                   - t.get("scheduler.update", 0.0) - t.get("detokenization", 0.0))
    rows.append(("engine, rest of step (outputs, metrics)", engine_rest))
    rows.append(("whole step", t["_step"]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the main thread's CPU time (time.thread_time), which other processes "
                         "on a shared machine do not inflate; use it with --threads 1, so that all "
                         "the work runs on that thread")
    args = ap.parse_args()

    import torch

    from engine import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    quant = None if args.quantization == "none" else args.quantization
    llm = LLM(model=None, quantization=quant, kv_cache_gib=0.25, max_num_seqs=4)
    prompt = make_prompt(llm.engine.tokenizer.encode, args.prompt, 0)
    llm.generate([prompt], [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)])  # warm
    timers = instrument(llm, time.thread_time if args.clock == "cpu" else time.perf_counter)
    runs = [profile_run(llm, timers, prompt, args.gen)[0] for _ in range(args.runs)]
    per_run = [table(r) for r in runs]
    names = [name for name, _ in per_run[0]]
    med = {n: statistics.median(dict(r)[n] for r in per_run) for n in names}
    whole = med["whole step"]
    print(f"quantization={args.quantization}, {args.prompt}-token prompt, {args.gen} decode steps, "
          f"median of {args.runs} runs, {args.threads} threads, {args.clock} clock; linear runtime "
          f"{llm.engine.runner.quantization or 'float'}")
    print("| part | ms per step | share |")
    print("|---|---:|---:|")
    for n in names:
        print(f"| {n} | {med[n]:.2f} | {med[n] / whole:.0%} |")
    print(f"\n(= {1e3 / whole:.1f} tok/s from the step alone)")


if __name__ == "__main__":
    main()
