"""GPU benchmark: kernel checks, nano-vllm's throughput workload against transformers, and
single-stream decode, each against the device's memory-bandwidth ceiling.

(a) Kernels: each fused Triton kernel (RMSNorm + residual, RoPE, SiLU-and-mul) and the attention
    kernels (engine/attention/triton_backend.check_against_reference) against their torch
    references at bf16, realistic shapes.
(b) nano-vllm's bench.py workload: 256 requests, prompt and output lengths uniform in [100, 1024],
    prompt ids uniform in [0, 10000] (random.seed(0), same call order), temperature 0.6,
    ignore_eos, on a Qwen3-0.6B-shaped model with random weights (built from its published
    config, no download). Ours runs all 256. transformers' continuous batching (`paged|sdpa` where
    the installed version takes it, else `sdpa`; explicit num_blocks and max_batch_tokens) is
    bounded by running only the first --hf-requests of them (default 64) under a time cap; ours
    runs that same sub-workload too, and the ratio compares those two runs.
    Bandwidth ceiling: the bytes our schedule must read (weights once per step, plus each
    sequence's KV context per step) at the measured device copy bandwidth, over the time taken.
(c) Single-stream decode tokens/s for Qwen3-0.6B and Llama-3-8B shapes (random weights) against
    the ceiling of one weight read plus the context's KV per token.
(d) Weight-only quantization (bench/quant_gpu.py): the int8/int4 Triton matmuls against their
    reference (with the kernel checks), their speed per Llama-3-8B linear against bf16 F.linear,
    and (c)'s Llama-3-8B decode row per quantization (int4, int8).

Run: python bench/engine_gpu.py (at most --budget seconds, 6 minutes by default). --cpu-smoke
(automatic without CUDA) runs a reduced version on the CPU: tiny shapes, a handful of requests,
the kernels (attention included, at tiny shapes) under the Triton interpreter. Written for
torch >= 2.11, triton >= 3.6, transformers >= 5.17, Python >= 3.11. Order: kernel checks, copy
bandwidth, (c) for Llama, (d), then (b) and (c) for Qwen3, transformers last. --phases picks some.

Isolation: each phase (kernel checks, copy bandwidth, llama, throughput) runs in a child process
of its own (this script with --only), which writes its rows to a JSON file as soon as each is
known; the parent merges them into one report. A sticky CUDA error (an illegal memory access in a
kernel check), a segfault or a hang then costs that phase only: the later ones start in a fresh
process with a fresh CUDA context, and the report names the phase that failed and how.

Time: --budget (seconds, default 360) bounds the whole run. Each child gets what is left of it
(less a grace for stopping) as its own --budget: inside it a phase still running when that runs
out is interrupted (SIGALRM), and transformers has its own limit inside that. A child that has not
exited when its share is up (a hang in native code, where no Python handler runs) gets SIGTERM,
then SIGKILL; its rows so far are kept. A phase that would start with too little left is skipped.
Each of these is reported as a note and the report is printed all the same. Killed from outside
(SIGTERM, as `timeout` does), the script stops the running child and prints the report it has so
far before it exits. Every result row is also printed as soon as it is known.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import gc
import importlib
import inspect
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.quant_gpu import (  # noqa: E402
    check_quant_kernels,
    decode_tiling_notes,
    engine_supports_quantization,
    matmul_speed_notes,
    resident_weight_bytes,
)

QWEN3_0_6B = {  # Qwen/Qwen3-0.6B config.json, the fields that shape the network
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 40960,
    "hidden_act": "silu", "attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
LLAMA3_8B = {  # meta-llama/Meta-Llama-3-8B
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "max_position_embeddings": 8192, "hidden_act": "silu",
}
# --cpu-smoke: the same families, tiny (vocab above 10000: the workload's prompt ids reach it).
_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 10240, "bos_token_id": 1, "eos_token_id": 2}
TINY_QWEN3 = {**QWEN3_0_6B, **_TINY, "intermediate_size": 128, "head_dim": 16}
TINY_LLAMA = {**LLAMA3_8B, **_TINY, "intermediate_size": 160}


@dataclass
class Settings:
    device: torch.device
    dtype: torch.dtype
    qwen: dict
    llama: dict
    qwen_name: str
    llama_name: str
    num_requests: int
    min_len: int
    max_len: int
    hf_requests: int
    hf_cap_s: float
    decode_prompt: int
    decode_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    smoke: bool


class Overrun(BaseException):
    """A time limit ran out (raised by SIGALRM). A BaseException, so that no library's own
    `except Exception` swallows it; the phase runner catches it by name."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise Overrun in the main thread once `seconds` have passed. Nests: an enclosing limit that
    ends sooner stays in force (and is restored, less the time spent, on the way out)."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    outer_left = signal.getitimer(signal.ITIMER_REAL)[0]
    if outer_left and outer_left <= seconds:
        yield
        return
    start = time.monotonic()

    def expire(signum, frame) -> None:
        raise Overrun(f"{what} ran past its {seconds:.0f}s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 0.01))


FAULT_ENV = "ENGINE_GPU_FAULT"


def inject_fault(point: str) -> None:
    """Test hook for the isolation and time limits, driven by ENGINE_GPU_FAULT="point:mode[,...]";
    the points are the phase names and "transformers" (inside its continuous batching block). Modes:
    raise (an exception, as a sticky CUDA error raises), exit (the process exits without a word),
    segv (it dies of SIGSEGV), overrun (sleeps until its time limit interrupts it), hang (sleeps with
    SIGALRM and SIGTERM ignored, as a hang in native code does: only the parent's SIGKILL ends it)."""
    for spec in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        where, _, mode = spec.rpartition(":")
        if where != point:
            continue
        print(f"[fault] injecting {mode!r} at {point!r} ({FAULT_ENV})", flush=True)
        if mode == "raise":
            raise RuntimeError(f"injected fault at {point}")
        if mode == "exit":
            os._exit(3)
        if mode == "segv":
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang":  # as if stuck in native code: the Python handlers never get to run
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if mode in ("overrun", "hang"):
            while True:
                time.sleep(1)
        raise ValueError(f"{FAULT_ENV}: unknown mode {mode!r} in {spec!r}")


@dataclass
class Report:
    kernels: list[tuple[str, str, str]] = field(default_factory=list)  # (check, value, verdict)
    rows: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)  # measurements later phases use
    sink: Path | None = None  # a phase's child process: everything is saved here as soon as known

    def kernel(self, check: str, value: str, verdict: str) -> None:
        self.kernels.append((check, value, verdict))
        self.save()
        print(f"[kernel] {check}: {value} {verdict}", flush=True)

    def row(self, *cells: str) -> None:
        self.rows.append(cells)  # type: ignore[arg-type]
        self.save()
        print("[result] " + " | ".join(cells), flush=True)

    def note(self, text: str, echo: bool = True) -> None:
        self.notes.append(text)
        self.save()
        if echo:
            print(f"[note] {text}", flush=True)

    def value(self, key: str, number: float) -> None:
        self.values[key] = number
        self.save()

    def save(self) -> None:
        """Write everything so far to the sink, atomically: a child killed at any point leaves the
        rows it had."""
        if self.sink is None:
            return
        tmp = self.sink.with_name(self.sink.name + ".tmp")
        tmp.write_text(json.dumps({"kernels": self.kernels, "rows": self.rows, "notes": self.notes,
                                   "values": self.values}))
        os.replace(tmp, self.sink)

    def merge(self, path: Path) -> bool:
        """Add what a child saved at `path`; False where it saved nothing (readable)."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        self.kernels += [tuple(k) for k in data.get("kernels", [])]
        self.rows += [tuple(r) for r in data.get("rows", [])]
        self.notes += data.get("notes", [])
        self.values.update(data.get("values", {}))
        return True

    def markdown(self) -> str:
        out = ["| kernel check (vs torch reference) | max error | verdict |", "|---|---:|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in self.kernels]
        out += ["", "| benchmark | ours tok/s | transformers tok/s | ours / transformers | "
                    "bandwidth ceiling tok/s | ours / ceiling |", "|---|---:|---:|---:|---:|---:|"]
        out += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.notes:
            out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out)


# ---- (a) kernels -------------------------------------------------------------------------------


def check_kernels(device: torch.device, dtype: torch.dtype, small: bool) -> list[tuple[str, float, float]]:
    """(name, error, tolerance) per check. Error: max |kernel - reference| over max |reference|,
    so bf16's 2**-8 relative step is the unit: the kernels round where the references do, so one
    ulp flips are all that may differ (tolerance: two ulps at the largest magnitude)."""
    from engine.kernels.activation import silu_and_mul_torch, silu_and_mul_triton
    from engine.kernels.norm import rms_norm_torch, rms_norm_triton
    from engine.kernels.rope import rope_torch, rope_triton_
    from engine.layers.rotary import RotaryEmbedding, rope_inv_freq

    tol = {torch.bfloat16: 2**-6, torch.float16: 2**-9, torch.float32: 1e-5}[dtype]
    gen = torch.Generator().manual_seed(0)
    tokens, hidden, heads, kv_heads, head_dim, inter = (
        (7, 72, 4, 2, 24, 88) if small else (4096, 1024, 16, 8, 128, 3072))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    def err(got: torch.Tensor, want: torch.Tensor) -> float:
        return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()

    results = []
    x, res, w = randn(tokens, hidden), randn(tokens, hidden), randn(hidden).abs() + 0.5
    got, got_sum = rms_norm_triton(x, w, 1e-6, res)
    want, want_sum = rms_norm_torch(x, w, 1e-6, res)
    results.append((f"rms_norm + residual [{tokens}, {hidden}]",
                    max(err(got, want), err(got_sum, want_sum)), tol))
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    wq = randn(head_dim).abs() + 0.5
    results.append((f"rms_norm per head (qk-norm) [{tokens}, {heads}, {head_dim}]",
                    err(rms_norm_triton(q, wq, 1e-6), rms_norm_torch(q, wq, 1e-6)), tol))
    rotary = RotaryEmbedding(4096, rope_inv_freq(head_dim, 1e6, None, None), device)
    positions = torch.randint(0, 4096, (tokens,), generator=gen).to(device)
    want_q, want_k = rope_torch(positions, q.clone(), k.clone(), rotary.cos, rotary.sin)
    rope_triton_(positions, q, k, rotary.cos, rotary.sin)
    results.append((f"rope in place q [{tokens}, {heads}, {head_dim}], k {kv_heads} heads",
                    max(err(q, want_q), err(k, want_k)), tol))
    gate_up = randn(tokens, 2 * inter)
    results.append((f"silu_and_mul [{tokens}, 2 x {inter}]",
                    err(silu_and_mul_triton(gate_up), silu_and_mul_torch(gate_up)), tol))
    return results


def run_kernel_checks(s: Settings, report: Report) -> None:
    dtype = torch.float32 if s.smoke else torch.bfloat16
    where = "interpreter, fp32" if s.smoke else str(dtype).removeprefix("torch.")
    try:
        for name, e, tol in check_kernels(s.device, dtype, small=s.smoke):
            report.kernel(f"{name} ({where})", f"{e:.2e} (tol {tol:.1e})", "PASS" if e <= tol else "FAIL")
    except Exception as exc:  # report and go on: the throughput numbers are still worth having
        traceback.print_exc()
        report.kernel("fused kernels", f"error: {exc!r}"[:120], "FAIL")
    try:
        for name, e, tol in check_quant_kernels(s.device, dtype, small=s.smoke):
            report.kernel(f"{name} ({where})", f"{e:.2e} (tol {tol:.1e})", "PASS" if e <= tol else "FAIL")
    except Exception as exc:
        traceback.print_exc()
        report.kernel("quantized weight matmuls", f"error: {exc!r}"[:120], "FAIL")
    check = _attention_check()
    if check is None:
        report.kernel("attention (check_against_reference)", "missing", "n/a")
        return
    # The attention engineer's check: realistic shapes on CUDA; on the CPU (interpreted) the tiny
    # shapes of its own test. Their doc: errors about 1e-2 at bf16, 1e-3 at fp16, 0 for the KV write.
    tiny = dict(num_decodes=4, max_context=40, prefill=((13, 13), (30, 11), (9, 2)), heads=4, kv_heads=2,
                head_dim=32, block_size=8)
    tol = 1e-3 if s.smoke else 5e-2
    try:
        params = inspect.signature(check).parameters
        kwargs = {k: v for k, v in tiny.items() if k in params} if s.smoke else {}
        for name, e in check(s.device, dtype, **kwargs):
            report.kernel(f"attention: {name} ({where})", f"{e:.2e} (tol {tol:.1e})",
                          "PASS" if e <= tol else "FAIL")
    except Exception as exc:
        traceback.print_exc()
        report.kernel("attention (check_against_reference)", f"error: {exc!r}"[:120], "FAIL")


def _attention_check() -> Callable | None:
    """check_against_reference from wherever the attention side keeps it, or None."""
    for module in ("engine.attention.triton_check", "engine.attention.triton_backend"):
        try:
            return importlib.import_module(module).check_against_reference
        except (ImportError, AttributeError):
            continue
    return None


# ---- models with random weights ----------------------------------------------------------------


def hf_config_dict(cfg: dict) -> dict:
    """The config as transformers normalises it (rope_parameters etc.), so both sides read one."""
    from transformers import AutoConfig

    rest = {k: v for k, v in cfg.items() if k != "model_type"}
    return AutoConfig.for_model(cfg["model_type"], **rest).to_dict()


def random_weights(cfg: dict, dtype: torch.dtype, device: torch.device, seed: int = 0,
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Hugging Face-named random tensors (std 0.02, norms 1), one at a time, made on the device."""
    from engine.config import ModelConfig

    mc = ModelConfig.from_hf(cfg)
    gen = torch.Generator(device=device).manual_seed(seed)
    hd, q, kv = mc.head_dim, mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(dtype)

    yield "model.embed_tokens.weight", rnd(mc.vocab_size, mc.hidden_size)
    for i in range(mc.num_layers):
        p = f"model.layers.{i}."
        h, inter = mc.hidden_size, mc.intermediate_size
        for name, rows, cols in (("self_attn.q_proj", q, h), ("self_attn.k_proj", kv, h),
                                 ("self_attn.v_proj", kv, h), ("self_attn.o_proj", h, q),
                                 ("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h),
                                 ("mlp.down_proj", h, inter)):
            yield f"{p}{name}.weight", rnd(rows, cols)
        for name, size in (("input_layernorm", mc.hidden_size), ("post_attention_layernorm", mc.hidden_size)):
            yield f"{p}{name}.weight", torch.ones(size, dtype=dtype, device=device)
        if mc.qk_norm:
            yield f"{p}self_attn.q_norm.weight", torch.ones(hd, dtype=dtype, device=device)
            yield f"{p}self_attn.k_norm.weight", torch.ones(hd, dtype=dtype, device=device)
    yield "model.norm.weight", torch.ones(mc.hidden_size, dtype=dtype, device=device)
    if not mc.tie_word_embeddings:
        yield "lm_head.weight", rnd(mc.vocab_size, mc.hidden_size)


def build_engine(cfg: dict, weights: Iterator[tuple[str, torch.Tensor]], s: Settings, **overrides):
    from engine.config import EngineConfig, ModelConfig
    from engine.engine_core import LLMEngine
    from engine.loader import Checkpoint

    kwargs = dict(device=str(s.device), dtype=str(s.dtype).removeprefix("torch."),
                  max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                  max_model_len=s.max_model_len, gpu_memory_utilization=0.6,
                  kv_cache_gib=0.5 if s.smoke else None)
    kwargs.update(overrides)
    ckpt = Checkpoint(config=ModelConfig.from_hf(cfg), tokenizer=None, weights=weights)
    return LLMEngine(EngineConfig(**kwargs), ckpt)


def weight_bytes_per_step(engine) -> int:
    """Parameters a decode step reads in full: all of them, except an untied embedding (only the
    batch's rows of it are read). A tied embedding is read whole, as the LM head."""
    model = engine.runner.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not engine.model_config.tie_word_embeddings:
        total -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    return total


def load_hf_model(cfg: dict, s: Settings):
    """transformers' own model of `cfg` with its random init, and the attention it accepted."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    hf_cfg = transformers.AutoConfig.for_model(cfg["model_type"],
                                               **{k: v for k, v in cfg.items() if k != "model_type"})
    errors = []
    for attn in ("paged|sdpa", "sdpa"):  # "paged|sdpa" was dropped in 5.23; 5.17 takes it
        try:
            with torch.device(s.device):
                model = AutoModelForCausalLM.from_config(hf_cfg, dtype=s.dtype, attn_implementation=attn)
            return model.eval(), attn
        except (ValueError, ImportError, KeyError) as exc:
            errors.append(f"{attn}: {exc}")
    raise RuntimeError("transformers accepted no attention implementation: " + "; ".join(errors))


# ---- timing helpers ----------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s a large device-to-device copy moves (read + write counted)."""
    n = (2 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    iters = 10 if device.type == "cuda" else 3
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync(device)
    seconds = time.perf_counter() - start
    del src, dst
    return 2 * n * iters / seconds


def nano_vllm_workload(n: int, lo: int, hi: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """nano-vllm bench.py's requests: the same calls on the same RNG stream (its module-level
    randint after seed(0) is a Random(0) instance's)."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    lengths = [rng.randint(lo, hi) for _ in range(n)]
    return prompts, lengths


class StepTrace:
    """Counts our runner's steps and the KV tokens each step's attention reads (its sequences'
    contexts), to price the schedule at the bandwidth ceiling."""

    def __init__(self, engine) -> None:
        self.runner, self.steps, self.kv_tokens = engine.runner, 0, 0
        inner = self.runner.execute

        def execute(batch):
            self.steps += 1
            self.kv_tokens += sum(seq.num_computed_tokens + n
                                  for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True))
            return inner(batch)

        self.runner.execute = execute

    def close(self) -> None:
        del self.runner.execute  # back to the class's method


_run_ids = iter(range(1 << 30))


def run_ours(engine, prompts: list[list[int]], lengths: list[int], temperature: float,
             ) -> tuple[float, int, StepTrace]:
    """Seconds to finish every request (add_request included, as nano-vllm times generate()),
    output tokens, and the step trace."""
    from engine.sampling_params import SamplingParams

    run = next(_run_ids)
    # Cold prefix cache, as transformers starts: the first-k rerun would otherwise find its prompts
    # still cached from the full run and skip most of their prefill.
    engine.block_manager.reset_prefix_cache()
    trace = StepTrace(engine)
    sync(engine.device)
    start = time.perf_counter()
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"run{run}-{i}", p, SamplingParams(temperature=temperature, max_tokens=n,
                                                              ignore_eos=True))
    tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens += len(out.token_ids)
    seconds = time.perf_counter() - start
    trace.close()
    if tokens != sum(lengths):
        raise RuntimeError(f"ours made {tokens} tokens, {sum(lengths)} were asked for")
    return seconds, tokens, trace


def single_stream(engine, prompt_len: int, n: int, vocab: int) -> float:
    """Decode tokens/s of one request: n tokens over the time from its first token to its last
    (so prefill is out); after a short warm-up of the same shape."""
    from engine.sampling_params import SamplingParams

    rng = random.Random(1)
    prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
    run = next(_run_ids)
    for label, steps in (("warm", 8), ("timed", 1 + n)):
        engine.add_request(f"one{run}-{label}", prompt, SamplingParams(temperature=0.0, max_tokens=steps,
                                                                     ignore_eos=True))
        stamps = []
        while engine.has_unfinished_requests():
            if engine.step():
                stamps.append(time.perf_counter())
    return n / (stamps[-1] - stamps[0])


# ---- transformers ------------------------------------------------------------------------------


def run_transformers(model, prompts: list[list[int]], lengths: list[int], temperature: float,
                     max_batch_tokens: int, cap_s: float) -> tuple[float, int, int, str]:
    """transformers' continuous batching (the manager behind generate_batch, for per-request
    max_new_tokens), warmed up on a few short requests first. Returns seconds, output tokens of
    finished requests, number finished, and the effective config."""
    from transformers import GenerationConfig

    try:
        from transformers.generation import ContinuousBatchingConfig
    except ImportError:
        ContinuousBatchingConfig = None  # older versions size the cache from GenerationConfig

    gen = GenerationConfig(do_sample=temperature > 0, temperature=temperature or None, top_k=0, top_p=1.0,
                           max_new_tokens=max(lengths), eos_token_id=-1, pad_token_id=0)
    warm = [p[:16] for p in prompts[:4]]
    cb = None
    described = f"max_batch_tokens {max_batch_tokens}"
    if ContinuousBatchingConfig is not None:
        known = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        cb = ContinuousBatchingConfig(**{k: v for k, v in {"max_batch_tokens": max_batch_tokens}.items()
                                         if k in known})
        page = getattr(cb, "page_size", None) or getattr(cb, "block_size", None)
        if page and "num_blocks" in known:  # else its own sizing (a fraction of free memory)
            cb.num_blocks = sum(-(-(len(p) + n) // page) for p, n in zip(prompts, lengths, strict=True)) \
                + len(prompts) + len(warm)
            described += f", page {page}, num_blocks {cb.num_blocks}"
    else:
        gen.max_batch_tokens = max_batch_tokens  # how versions before ContinuousBatchingConfig took it
    cbm = CBManager(model, gen, cb)
    with cbm as manager:
        _collect(manager, _submit(manager, warm, [8] * len(warm), "warm"), time.perf_counter() + 120)
        sync(model.device)
        start = time.perf_counter()
        ids = _submit(manager, prompts, lengths, "req")
        inject_fault("transformers")
        done = _collect(manager, ids, start + cap_s)
        seconds = time.perf_counter() - start
        if len(done) < len(ids):
            cbm.hard_stop()
    return seconds, sum(done.values()), len(done), described


class CBManager:
    """The continuous batching manager across versions: the context manager where it exists
    (it warms up CUDA graphs), else init_continuous_batching + start/stop."""

    def __init__(self, model, gen, cb) -> None:
        self.model, self.gen, self.cb, self.cm, self.manager = model, gen, cb, None, None
        self.hard_stopped = False

    def __enter__(self):
        kwargs = {"generation_config": self.gen, "continuous_batching_config": self.cb, "block": True,
                  "timeout": 30}
        factory = getattr(self.model, "continuous_batching_context_manager", None)
        if factory is None:
            factory = self.model.init_continuous_batching
        params = inspect.signature(factory).parameters
        if self.cb is not None and "continuous_batching_config" not in params:
            self.gen.continuous_batching_config = self.cb  # the older way in
        kwargs = {k: v for k, v in kwargs.items() if k in params and v is not None}
        if factory.__name__ == "continuous_batching_context_manager":
            self.cm = factory(**kwargs)
            self.manager = self.cm.__enter__()
            return self.manager
        self.manager = factory(**kwargs)
        self.manager.start()
        return self.manager

    def hard_stop(self) -> None:
        self.hard_stopped = True
        _hard_stop(self.manager)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and not self.hard_stopped:
            # Left by an exception (a time limit, a failed request): the normal exit would first
            # finish every pending request (up to its 30 s timeout). Stop at once, failing them.
            try:
                self.hard_stop()
                print(f"transformers: hard stop on leaving its block with {exc_type.__name__}", flush=True)
            except Exception:
                traceback.print_exc()
        if self.hard_stopped and self.manager.is_running():
            # Its thread outlived the hard stop's timeout: the normal exit path would wait on it
            # (destroy() joins without a timeout). Leave it; the phase's process ends with os._exit.
            print("transformers' generation thread did not stop after a hard stop; left behind", flush=True)
            return False
        if self.cm is not None:
            return self.cm.__exit__(exc_type, exc, tb)
        if not self.hard_stopped:
            self.manager.stop(block=True, timeout=30)
        return False


def _hard_stop(manager) -> None:
    """Stop at once, failing what is unfinished. A plain stop (what leaving the context manager
    does) first finishes every pending request, which after the cap could outlast the budget."""
    if "hard_stop" in inspect.signature(manager.stop).parameters:
        manager.stop(block=True, timeout=10, hard_stop=True)
    else:
        manager.stop(block=True, timeout=10)


def _submit(manager, prompts: list[list[int]], lengths: list[int], prefix: str) -> list[str]:
    ids = []
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        rid = f"{prefix}-{i}"
        manager.add_request(p, request_id=rid, max_new_tokens=n)
        ids.append(rid)
    return ids


def _collect(manager, ids: list[str], deadline: float) -> dict[str, int]:
    """request id -> generated tokens, for those that finished before the deadline."""
    pending, done = set(ids), {}
    while pending and time.perf_counter() < deadline:
        res = manager.get_result(timeout=1.0)
        if res is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped; see its log")
            continue
        finished = res.is_finished() if hasattr(res, "is_finished") else "FINISHED" in str(res.status)
        if res.request_id in pending and finished:
            if getattr(res, "error", None):
                raise RuntimeError(f"transformers failed request {res.request_id}: {res.error}")
            pending.discard(res.request_id)
            done[res.request_id] = len(res.generated_tokens)
    return done


# ---- the phases --------------------------------------------------------------------------------


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def throughput_phase(s: Settings, report: Report, bandwidth: float, time_left: Callable[[], float]) -> None:
    """Ours on the whole workload, ours and transformers on its first --hf-requests, single-stream.
    Each part reports on its own: one that fails leaves a note and the others still run."""
    cfg = hf_config_dict(s.qwen)
    prompts, lengths = nano_vllm_workload(s.num_requests, s.min_len, s.max_len)
    temperature = 0.6
    model, attn = load_hf_model(s.qwen, s)
    k = min(s.hf_requests, len(prompts))
    sub_p, sub_l = prompts[:k], lengths[:k]
    ours_tps = o_ceil = o_frac = None
    try:
        engine = build_engine(cfg, iter(model.state_dict().items()), s)
        w_bytes, kv_bytes = weight_bytes_per_step(engine), engine.model_config.kv_bytes_per_token(s.dtype)
        print(f"ours: {engine.runner.num_blocks} KV blocks, CUDA graphs: "
              f"{engine.runner.graphs.sizes if engine.runner.graphs else 'off'}; weights read per step "
              f"{w_bytes / 1e9:.2f} GB, KV {kv_bytes} B/token", flush=True)
        run_ours(engine, [[1, 2, 3]] * 2, [4, 4], temperature)  # warm-up (nano-vllm does one too)

        def ceiling(seconds: float, tokens: int, trace: StepTrace) -> tuple[float, float]:
            floor_s = (trace.steps * w_bytes + trace.kv_tokens * kv_bytes) / bandwidth
            return tokens / floor_s, floor_s / seconds

        try:
            seconds, tokens, trace = run_ours(engine, prompts, lengths, temperature)
            ceil_tps, frac = ceiling(seconds, tokens, trace)
            print(f"ours, {len(prompts)} requests: {tokens} tokens in {seconds:.1f}s = "
                  f"{tokens / seconds:,.0f} tok/s ({trace.steps} steps)", flush=True)
            report.row(f"nano-vllm workload, {len(prompts)} requests, {s.qwen_name}", fmt(tokens / seconds),
                       "-", "-", fmt(ceil_tps), f"{frac:.2f}")
        except Exception as exc:
            traceback.print_exc()
            report.note(f"ours on the {len(prompts)}-request workload failed: {exc!r}"[:300])
        try:
            o_seconds, o_tokens, o_trace = run_ours(engine, sub_p, sub_l, temperature)
            ours_tps = o_tokens / o_seconds
            o_ceil, o_frac = ceiling(o_seconds, o_tokens, o_trace)
        except Exception as exc:
            traceback.print_exc()
            report.note(f"ours on the first {k} requests failed: {exc!r}"[:300])
        try:
            single = single_stream(engine, s.decode_prompt, s.decode_tokens, 10000)
            single_ceil = bandwidth / (w_bytes + (s.decode_prompt + s.decode_tokens / 2) * kv_bytes)
            report.row(f"single-stream decode, {s.qwen_name} ({s.decode_tokens} tokens after "
                       f"{s.decode_prompt})", fmt(single), "-", "-", fmt(single_ceil),
                       f"{single / single_ceil:.2f}")
        except Exception as exc:
            traceback.print_exc()
            report.note(f"single-stream decode of {s.qwen_name} failed: {exc!r}"[:300])
    except Exception as exc:  # the engine itself: transformers still runs
        traceback.print_exc()
        report.note(f"building or warming up our engine failed: {exc!r}"[:300])
    engine = trace = o_trace = None  # noqa: F841 (free the KV pool before transformers runs)
    free_memory(s.device)

    # The last thing the benchmark runs, within what is left of the budget: the timed run gets `cap`
    # seconds, its warm-up (CUDA graph capture) and shutdown `slack` more, after which it is stopped.
    slack = 30 if s.smoke else 90
    cap = max(10.0, min(s.hf_cap_s, time_left() - slack - 10))
    hf = None
    try:
        with time_limit(cap + slack, "transformers (warm-up, run, shutdown)"):
            h_seconds, h_tokens, h_done, described = run_transformers(model, sub_p, sub_l, temperature,
                                                                      s.max_num_batched_tokens, cap)
        hf = h_tokens / h_seconds
        print(f"transformers ({attn}; {described}): {h_done}/{k} requests, {h_tokens} tokens in "
              f"{h_seconds:.1f}s = {hf:,.0f} tok/s", flush=True)
        if h_done < k:
            report.note(f"transformers hit the {cap:.0f}s cap with {h_done}/{k} requests finished: "
                        "its tokens/s counts finished requests only (a lower bound)")
    except (Exception, Overrun) as exc:
        traceback.print_exc()
        report.note(f"transformers failed: {exc!r}"[:300])
    attn_cell = attn.replace("|", "\\|")  # a bare | would split the markdown cell
    report.row(f"same, first {k} requests: ours vs transformers continuous batching ({attn_cell})",
               fmt(ours_tps), fmt(hf), "-" if hf is None or ours_tps is None else f"{ours_tps / hf:.2f}",
               fmt(o_ceil), "-" if o_frac is None else f"{o_frac:.2f}")
    del model


def llama_phase(s: Settings, report: Report, bandwidth: float) -> None:
    cfg = hf_config_dict(s.llama)
    start = time.perf_counter()
    engine = build_engine(cfg, random_weights(cfg, s.dtype, s.device), s, max_num_seqs=1,
                          kv_cache_gib=0.5 if s.smoke else 4.0)
    w_bytes, kv_bytes = weight_bytes_per_step(engine), engine.model_config.kv_bytes_per_token(s.dtype)
    print(f"{s.llama_name} built in {time.perf_counter() - start:.0f}s "
          f"({w_bytes / 1e9:.1f} GB read per step)", flush=True)
    tps = single_stream(engine, s.decode_prompt, s.decode_tokens, 10000)
    ceil_tps = bandwidth / (w_bytes + (s.decode_prompt + s.decode_tokens / 2) * kv_bytes)
    report.row(f"single-stream decode, {s.llama_name} ({s.decode_tokens} tokens after "
               f"{s.decode_prompt})", fmt(tps), "-", "-", fmt(ceil_tps), f"{tps / ceil_tps:.2f}")


def quantized_phase(s: Settings, report: Report, bandwidth: float) -> None:
    """(d): the matmul timings (CUDA only), then the Llama decode row per quantization."""
    if s.smoke:
        report.note("quantized matmul timings skipped: the interpreter's times mean nothing")
    else:
        for line in matmul_speed_notes(s.device, bandwidth) + decode_tiling_notes(s.device):
            report.note(line)
        free_memory(s.device)
    if not engine_supports_quantization():
        report.note("quantized decode rows skipped: this engine's EngineConfig has no quantization option")
        return
    cfg = hf_config_dict(s.llama)
    for mode in ("int4", "int8"):
        engine = build_engine(cfg, random_weights(cfg, s.dtype, s.device), s, max_num_seqs=1,
                              kv_cache_gib=0.5 if s.smoke else 4.0, quantization=mode)
        w_bytes, kv_bytes = resident_weight_bytes(engine), engine.model_config.kv_bytes_per_token(s.dtype)
        tps = single_stream(engine, s.decode_prompt, s.decode_tokens, 10000)
        ceil_tps = bandwidth / (w_bytes + (s.decode_prompt + s.decode_tokens / 2) * kv_bytes)
        report.row(f"single-stream decode, {s.llama_name}, {mode} weights ({w_bytes / 1e9:.2f} GB; "
                   f"{s.decode_tokens} tokens after {s.decode_prompt})", fmt(tps), "-", "-", fmt(ceil_tps),
                   f"{tps / ceil_tps:.2f}")
        engine = None
        free_memory(s.device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- main --------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="reduced run on the CPU (automatic without CUDA)")
    ap.add_argument("--hf-requests", type=int, default=64,
                    help="first N requests of the workload that transformers (and ours, for the ratio) run")
    ap.add_argument("--hf-cap", type=float, default=150.0, help="seconds transformers may take at most")
    ap.add_argument("--budget", type=float, default=360.0, help="seconds for the whole run: a phase "
                    "still running then is interrupted, later ones are skipped, the report is printed")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help=f"comma-separated phases to run, in this order: {', '.join(PHASES)} (default: all)")
    # The parent's calls of itself, one per phase (not for use by hand):
    ap.add_argument("--only", choices=PHASES, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--bandwidth", type=float, default=float("nan"), help=argparse.SUPPRESS)
    ap.add_argument("--kill-at", type=float, help=argparse.SUPPRESS)  # time.time() the parent kills at
    return ap.parse_args()


def settings(args: argparse.Namespace) -> Settings:
    if args.cpu_smoke:
        return Settings(
            torch.device("cpu"), torch.float32, TINY_QWEN3, TINY_LLAMA, "tiny Qwen3", "tiny Llama",
            num_requests=8, min_len=8, max_len=32, hf_requests=min(args.hf_requests, 8), hf_cap_s=60.0,
            decode_prompt=16, decode_tokens=16, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128,
            smoke=True)
    return Settings(
        torch.device("cuda"), torch.bfloat16, QWEN3_0_6B, LLAMA3_8B, "Qwen3-0.6B shape", "Llama-3-8B shape",
        num_requests=256, min_len=100, max_len=1024, hf_requests=args.hf_requests, hf_cap_s=args.hf_cap,
        decode_prompt=128, decode_tokens=256, max_num_seqs=256, max_num_batched_tokens=16384,
        max_model_len=4096, smoke=False)


def machine_info(device: torch.device) -> str:
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    return (f"{name}; torch {torch.__version__}; triton {triton_version}; transformers "
            f"{transformers.__version__}; Python {platform.python_version()}")


# Cheap and bounded first; transformers, the least predictable, runs last (in "throughput").
PHASES = ("kernel checks", "copy bandwidth", "llama", "quantized", "throughput")
# The most of the budget a phase may take, so that a hang early on leaves the later phases their
# time (throughput: the rest). Expected on CUDA: kernel checks (Triton compiles) under a minute,
# copy bandwidth seconds, llama (8B random weights, graph capture, 256 tokens) about a minute,
# quantized (matmul timings, then two 8B engines) about two.
PHASE_CAP_S = {"kernel checks": 120.0, "copy bandwidth": 45.0, "llama": 150.0, "quantized": 180.0}
SMOKE_PHASE_CAP_S = {"kernel checks": 40.0, "copy bandwidth": 15.0, "llama": 30.0,  # each ~1-3 s here
                     "quantized": 40.0}
# Below this much of its share a phase is skipped (llama and throughput need their models built).
PHASE_MIN_S = {"llama": 60.0, "quantized": 60.0, "throughput": 60.0}
END_RESERVE_S = 5.0  # the parent's own: stopping a child that overran (SIGTERM, 2 s, SIGKILL), the report


def child_grace(smoke: bool) -> float:
    """Seconds between a child's own --budget running out and the parent killing it: room for its
    SIGALRM to interrupt the phase and for transformers' hard stop (up to 10 s) on the way out."""
    return 5.0 if smoke else 15.0


def run_phase_child(args: argparse.Namespace, s: Settings) -> None:
    """--only PHASE: one phase in this process, saving to --result-file as it goes; ends with
    os._exit (no interpreter shutdown: a non-daemon transformers thread or a CUDA teardown after a
    sticky error must not keep the process alive). Exit code 0 when the phase ran through."""
    name = args.only
    report = Report(sink=args.result_file)
    report.save()  # an empty file: the parent tells "started, saved nothing" from "never started"
    start = time.perf_counter()
    budget, kill_in = args.budget, None
    if args.kill_at is not None:  # counted from the parent's start of this process, imports included
        kill_in = args.kill_at - time.time()
        budget = min(budget, kill_in - child_grace(s.smoke))

    def time_left() -> float:
        return budget - (time.perf_counter() - start)

    def terminated(signum, frame) -> None:
        report.note(f"phase {name}: stopped by signal {signum} after {time.perf_counter() - start:.0f}s; "
                    "what it reported before is kept")
        sys.stdout.flush()
        os._exit(1)

    signal.signal(signal.SIGTERM, terminated)
    # A hang in native code lets no Python handler run: dump every thread's stack just before the
    # parent kills this process, so the log shows where it hung.
    faulthandler.dump_traceback_later(max((kill_in or budget + child_grace(s.smoke)) - 2, 1), exit=False)

    def measure_bandwidth() -> None:
        bandwidth = copy_bandwidth(s.device)
        print(f"device copy bandwidth: {bandwidth / 1e9:,.0f} GB/s (read + write)", flush=True)
        report.note(f"bandwidth ceiling at the measured copy bandwidth, {bandwidth / 1e9:,.0f} GB/s; "
                    "prefill steps are priced as reads too, so the throughput ceiling is loose", echo=False)
        report.value("bandwidth", bandwidth)

    phases = {"kernel checks": lambda: run_kernel_checks(s, report),
              "copy bandwidth": measure_bandwidth,
              "llama": lambda: llama_phase(s, report, args.bandwidth),
              "quantized": lambda: quantized_phase(s, report, args.bandwidth),
              "throughput": lambda: throughput_phase(s, report, args.bandwidth, time_left)}
    code = 0
    try:
        with time_limit(budget, f"phase {name}"):
            inject_fault(name)
            phases[name]()
    except (Exception, Overrun) as exc:
        traceback.print_exc()
        report.note(f"phase {name} failed: {exc!r}"[:300])
        code = 1
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def stop_child(proc: subprocess.Popen) -> str:
    """SIGTERM (the child saves a note and exits), then SIGKILL; how it ended, in words."""
    if proc.poll() is not None:
        return f"it had just exited (code {proc.returncode})"
    proc.terminate()
    try:
        proc.wait(timeout=2)
        return "stopped with SIGTERM"
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        return "killed with SIGKILL (no answer to SIGTERM, as in a hang in native code)"


def main() -> None:
    args = parse_args()
    selected = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(selected) - set(PHASES))
    if unknown:
        sys.exit(f"--phases: unknown phase(s) {', '.join(unknown)}; the phases are {', '.join(PHASES)}")
    if args.only:
        if args.cpu_smoke:
            os.environ.setdefault("TRITON_INTERPRET", "1")  # as the parent sets it
            torch.set_num_threads(min(torch.get_num_threads(), 2))
        run_phase_child(args, settings(args))  # never returns
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("no CUDA device: running the reduced CPU smoke version (--cpu-smoke)")
        args.cpu_smoke = True
    if args.cpu_smoke:
        # Before anything imports triton: its own helpers are wrapped for the interpreter at import.
        # The children inherit it.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    s = settings(args)
    start = time.perf_counter()
    report = Report()
    failed_phases: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="engine-gpu-"))
    running: dict = {}  # the child now running: proc, name, result, merged

    def time_left() -> float:
        return args.budget - (time.perf_counter() - start)

    def finish(exit_code: int | None = None) -> None:
        report.notes.append(f"total bench time {time.perf_counter() - start:.0f}s"
                            + (" (CPU smoke: tiny shapes, numbers mean nothing)" if s.smoke else ""))
        print()
        print(report.markdown(), flush=True)
        shutil.rmtree(workdir, ignore_errors=True)
        if exit_code is not None:
            os._exit(exit_code)  # from a signal handler

    def collect(how: str | None) -> None:
        """Merge the running child's results; name the phase as failed unless it ran through."""
        if running.get("merged", True):
            return
        running["merged"] = True
        name, proc = running["name"], running["proc"]
        saved = report.merge(running["result"])
        if how is None and proc.returncode == 0:
            return
        failed_phases.append(name)
        if how is None:  # it exited by itself, unsuccessfully
            code = proc.returncode
            how = f"died of signal {-code}" if code < 0 else f"exited with code {code}"
            if code == 1 and any(n.startswith(f"phase {name} failed") for n in report.notes):
                return  # it named its own failure
        report.note(f"phase {name} failed: its process {how}" + ("" if saved else ", before saving anything"))

    def terminated(signum, frame) -> None:
        if running and not running.get("merged", True):
            collect(f"was running when the whole run was killed: {stop_child(running['proc'])}")
        report.notes.append(f"killed from outside (signal {signum}): the report holds what finished")
        finish(1)

    signal.signal(signal.SIGTERM, terminated)
    # The parent only waits; should it hang anyway, its stack comes out before an outer `timeout`.
    faulthandler.dump_traceback_later(args.budget + 15, exit=False)

    try:
        print(machine_info(s.device), flush=True)
    except Exception as exc:  # e.g. transformers missing: the engine's own phases still run
        report.note(f"machine info failed: {exc!r}"[:300])

    grace = child_grace(s.smoke)
    for name in (p for p in PHASES if p in selected):
        share = time_left() - END_RESERVE_S  # when the parent stops waiting for this child
        cap = (SMOKE_PHASE_CAP_S if s.smoke else PHASE_CAP_S).get(name)
        if cap is not None:
            share = min(share, cap + grace)
        child_budget = share - grace
        if child_budget < PHASE_MIN_S.get(name, 10.0) * (1 / 3 if s.smoke else 1):
            report.note(f"phase {name} skipped: {max(child_budget, 0):.0f}s were left of the "
                        f"{args.budget:.0f}s budget")
            continue
        result = workdir / f"{name.replace(' ', '-')}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--only", name,
               "--budget", f"{child_budget:.1f}", "--kill-at", f"{time.time() + share:.2f}",
               "--result-file", str(result),
               "--bandwidth", repr(report.values.get("bandwidth", math.nan)),
               "--hf-requests", str(args.hf_requests), "--hf-cap", str(args.hf_cap)]
        if s.smoke:
            cmd.append("--cpu-smoke")
        phase_start = time.perf_counter()
        sys.stdout.flush()
        sys.stderr.flush()
        # Same process group: an outer `timeout` (which signals its whole group) reaches the children,
        # so none outlives the run holding the GPU or the log's pipe.
        proc = subprocess.Popen(cmd)
        running.update(proc=proc, name=name, result=result, merged=False)
        try:
            proc.wait(timeout=share)
            how = None
        except subprocess.TimeoutExpired:
            how = f"ran past its {share:.0f}s share of the budget: {stop_child(proc)}"
        collect(how)
        print(f"phase {name}: {time.perf_counter() - phase_start:.0f}s", flush=True)
    faulthandler.cancel_dump_traceback_later()
    finish()
    failed = (any(v == "FAIL" for _, _, v in report.kernels) or bool(failed_phases)
              or any("failed" in n for n in report.notes))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
