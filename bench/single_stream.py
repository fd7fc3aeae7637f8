"""Single-stream rows of bench/engine_cpu.py: one user, prefill a prompt, then decode, per
quantization of our engine, and the same for llama.cpp's `llama-batched-bench` on the same GGUF.

Each quantization runs in a fresh subprocess (this file run as a script with --child), so the
process RSS after load is that quantization's alone, not mixed with the others' freed memory.

    python bench/single_stream.py [--quantizations none,auto,int8,int4] [--prompt 512] [--gen 128]

Prefill: seconds for a fresh `prompt`-token prompt to its first token (no prefix cache), as
prompt / T. Decode: (T(1 + gen) - T(1)) / gen on the same prompt (cached), as tokens per second;
llama-batched-bench reports the same two rates (S_PP, S_TG).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
QUANTIZATIONS = ("none", "auto", "int8", "int4")
# Issue 25's targets, ours / llama.cpp on the same file with quantization "auto".
TARGETS = {"decode": 1.0, "prefill": 2.0}
FILLER = ("The assistant keeps a diary of what it did for the user today: it read the notes, "
          "answered three messages on Telegram, ran the backup script, checked the weather in "
          "Berlin and wrote a short summary of yesterday's meeting. ")


@dataclass
class Row:
    system: str
    prefill_tps: float
    decode_tps: float
    rss_mib: float | None = None  # after load
    other_cpu: float | None = None  # the machine's CPU share other processes took meanwhile
    error: str | None = None


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_prompt(tokenizer_encode, n: int, salt: int) -> list[int]:
    """`n` tokens of plain text; `salt` makes the first token differ, so no prefix is cached."""
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer_encode(FILLER, allow_special=False)
    return [1 + salt % 1000] + ids[: n - 1]


def child(quantization: str, prompt_len: int, gen: int, repeats: int, threads: int) -> dict:
    """Load, measure RSS, time prefill and decode; returns the row as a dict (printed as JSON)."""
    import torch
    from engine_cpu import CpuWatch

    from engine import LLM, SamplingParams

    torch.set_num_threads(threads)
    quant = None if quantization == "none" else quantization
    start = time.perf_counter()
    try:
        llm = LLM(model=None, quantization=quant, kv_cache_gib=0.25, max_num_seqs=4)
    except TypeError as exc:  # an engine without the option: only fp32 can run
        if quant is not None:
            return {"error": f"LLM(quantization=...) not available: {exc}"}
        llm = LLM(model=None, kv_cache_gib=0.25, max_num_seqs=4)
    load_s = time.perf_counter() - start
    rss = rss_mib()
    encode = llm.engine.tokenizer.encode

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    def timed(prompt: list[int], n: int) -> float:
        t = time.perf_counter()
        llm.generate([prompt], [params(n)])
        return time.perf_counter() - t

    timed(make_prompt(encode, 64, 999), 4)  # warm-up: oneDNN primitives, allocator
    with CpuWatch() as watch:
        prefill = min(timed(make_prompt(encode, prompt_len, i), 1) for i in range(repeats))
        prompt = make_prompt(encode, prompt_len, repeats)
        timed(prompt, 1)  # cached from here on: T(1) and T(1 + gen) share the prefill
        t1 = min(timed(prompt, 1) for _ in range(repeats))
        tn = min(timed(prompt, 1 + gen) for _ in range(repeats))
    return {"prefill_tps": prompt_len / prefill, "decode_tps": gen / (tn - t1), "rss_mib": rss,
            "load_s": load_s, "other_cpu": watch.other_cpu}


def run_ours(quantization: str, prompt_len: int, gen: int, repeats: int, threads: int) -> Row:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", quantization,
           "--prompt", str(prompt_len), "--gen", str(gen), "--repeats", str(repeats),
           "--threads", str(threads)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(BENCH_DIR.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    name = f"ours, quantization={quantization}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return Row(name, float("nan"), float("nan"), error=(proc.stderr or proc.stdout)[-800:])
    got = json.loads(lines[-1])
    if "error" in got:
        return Row(name, float("nan"), float("nan"), error=got["error"])
    return Row(name, got["prefill_tps"], got["decode_tps"], got["rss_mib"], got["other_cpu"])


def run_llamacpp(gguf: str, prompt_len: int, gen: int, threads: int) -> Row | None:
    """None when no llama-batched-bench is found (bench/build_llamacpp.sh builds one)."""
    from llamacpp import batched_bench, find_binary

    binary = find_binary()
    if binary is None:
        return None
    name = f"llama.cpp llama-batched-bench (-t {threads} -fa on)"
    try:
        got = batched_bench(binary, gguf, prompt_len, gen, threads)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return Row(name, float("nan"), float("nan"), error=str(exc)[-800:])
    return Row(name, got.prefill_tps, got.decode_tps)


def report(rows: list[Row], llama: Row | None, prompt_len: int, gen: int) -> str:
    head = (f"| single stream ({prompt_len}-token prompt, {gen} new tokens) | prefill tok/s | "
            "decode tok/s | RSS after load (MiB) | prefill / llama.cpp | decode / llama.cpp | "
            "CPU taken by other processes |")
    out = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    ok = llama is not None and llama.error is None
    for r in rows + ([llama] if llama is not None else []):
        if r.error:
            out.append(f"| {r.system} | - | - | - | - | - | - |  (failed: {r.error.splitlines()[-1][:120]})")
            continue
        rss = f"{r.rss_mib:.0f}" if r.rss_mib is not None else "-"
        pr = f"{r.prefill_tps / llama.prefill_tps:.2f}x" if ok else "-"
        dr = f"{r.decode_tps / llama.decode_tps:.2f}x" if ok else "-"
        other = f"{r.other_cpu:.0%}" if r.other_cpu is not None else "-"
        out.append(f"| {r.system} | {r.prefill_tps:.1f} | {r.decode_tps:.1f} | {rss} | {pr} | {dr} "
                   f"| {other} |")
    auto = next((r for r in rows if r.system.endswith("=auto") and not r.error), None)
    if ok and auto is not None:
        out += ["", "| target (quantization=auto vs llama.cpp) | need | got | verdict |",
                "|---|---:|---:|---|"]
        for what, got in (("decode", auto.decode_tps / llama.decode_tps),
                          ("prefill", auto.prefill_tps / llama.prefill_tps)):
            need = TARGETS[what]
            out.append(f"| {what} | >= {need:.1f}x | {got:.2f}x | {'PASS' if got >= need else 'FAIL'} |")
    elif llama is None:
        out.append("\n(no llama-batched-bench found: bench/build_llamacpp.sh builds one)")
    return "\n".join(out)


def single_stream(gguf: str, quantizations: list[str], prompt_len: int = 512, gen: int = 128,
                  repeats: int = 2, threads: int = 2) -> str:
    rows = [run_ours(q, prompt_len, gen, repeats, threads) for q in quantizations]
    llama = run_llamacpp(gguf, prompt_len, gen, threads)
    return report(rows, llama, prompt_len, gen)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quantizations", default=",".join(QUANTIZATIONS))
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=QUANTIZATIONS, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.prompt, args.gen, args.repeats, args.threads)))
        return
    from engine_cpu import model_file

    directory, name = model_file()
    print(single_stream(os.path.join(directory, name), args.quantizations.split(","), args.prompt,
                        args.gen, args.repeats, args.threads))


if __name__ == "__main__":
    main()
