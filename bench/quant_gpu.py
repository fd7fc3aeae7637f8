"""The weight-only quantized rows of bench/engine_gpu.py (issue 25): the Triton int8/int4 matmuls
(engine/kernels/quant_matmul.py) against dequantize-then-matmul at realistic shapes, their speed
against bf16 `F.linear` (cuBLAS) on the same weights, and single-stream decode of the Llama-3-8B
shape per quantization against the bandwidth ceiling of its (now smaller) weights.

Decode is memory-bound: what a quantized layer saves is bytes, so each timing is also given as the
weight bytes it streamed per second, over the measured copy bandwidth. The weights cycle through
enough copies to exceed the GPU's L2 (50 MB on an H100), so no timing is served from cache.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

# Llama-3-8B's linears (fused as the engine holds them): (name, out, in).
LLAMA3_8B_LINEARS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
ROWS = (1, 16, 512)  # decode, a decode batch, a prefill chunk
KINDS = (("int8", None), ("int4/g32", 32), ("int4/g128", 128))
_L2_SPAN = 256 << 20  # bytes the cycled weight copies cover at least


def quantized(out: int, cols: int, group: int | None, device: torch.device, seed: int = 0):
    """Random canonical tensors: (qweight, scale) for int8, (qweight, scale, offset) for int4."""
    from engine.layers.quant import quantize_int4, quantize_int8

    w = torch.randn(out, cols, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    return quantize_int8(w) if group is None else quantize_int4(w, group)


def matmul(x: torch.Tensor, weight: tuple, group: int | None, bias: torch.Tensor | None = None, tiles=None):
    from engine.kernels.quant_matmul import int4_weight_matmul, int8_weight_matmul

    if group is None:
        return int8_weight_matmul(x, *weight, bias, tiles=tiles)
    return int4_weight_matmul(x, *weight, group, bias, tiles=tiles)


def dequantized(weight: tuple, group: int | None) -> torch.Tensor:
    from engine.layers.quant import dequantize_int4, dequantize_int8

    return dequantize_int8(*weight) if group is None else dequantize_int4(*weight, group)


def check_quant_kernels(device: torch.device, dtype: torch.dtype, small: bool,
                        ) -> list[tuple[str, float, float]]:
    """(name, error, tolerance) per check, as bench/engine_gpu.check_kernels: max |kernel - ref| over
    max |ref|, ref = x.float() @ dequantized.T (+ bias) in fp32 (no TF32). The kernels differ from it
    by fp32 summation order and the output's rounding: two ulps of the dtype at the largest value."""
    tol = {torch.bfloat16: 2**-6, torch.float16: 2**-9, torch.float32: 1e-5}[dtype]
    out, cols = (72, 256) if small else (4000, 4096)  # 4000: a partial last column tile
    results = []
    for label, group in KINDS:
        weight = quantized(out, cols, group, device, seed=1)
        w = dequantized(weight, group)
        for rows in (1, 16, 33) if small else ROWS:
            gen = torch.Generator(device=device).manual_seed(rows)
            x = torch.randn(rows, cols, generator=gen, device=device).to(dtype)
            bias = torch.randn(out, generator=gen, device=device).to(dtype)
            with _no_tf32():
                want = x.float() @ w.T + bias.float()
            got = matmul(x, weight, group, bias)
            err = ((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
            results.append((f"{label} weight matmul [{rows}, {cols}] x [{out}, {cols}]^T + bias", err, tol))
    return results


def matmul_speed_notes(device: torch.device, bandwidth: float) -> list[str]:
    """One line per (linear, rows): each kernel's time, the weight GB/s it streamed and that over
    the copy bandwidth, and bf16 F.linear's time on the same weight (the speedup)."""
    notes = []
    for name, out, cols in LLAMA3_8B_LINEARS:
        weights = {label: [quantized(out, cols, group, device, seed)
                           for seed in range(_copies(out, cols, group))] for label, group in KINDS}
        dense = [torch.randn(out, cols, device=device, dtype=torch.bfloat16)
                 for _ in range(_copies(out, cols, "bf16"))]
        for rows in ROWS:
            x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
            base = _time(device, [functools.partial(F.linear, x, w) for w in dense])
            cells = []
            for label, group in KINDS:
                seconds = _time(device, [functools.partial(matmul, x, w, group) for w in weights[label]])
                streamed = _nbytes(out, cols, group) / seconds
                cells.append(f"{label} {seconds * 1e6:,.0f} us ({streamed / 1e9:,.0f} GB/s, "
                             f"{streamed / bandwidth:.2f} of copy; {base / seconds:.2f}x bf16)")
            notes.append(f"quantized matmul Llama-3-8B {name} [{rows}, {cols}] x [{out}, {cols}]^T: "
                         + "; ".join(cells) + f"; bf16 F.linear {base * 1e6:,.0f} us")
        del weights, dense
    return notes


def decode_tiling_notes(device: torch.device) -> list[str]:
    """For one row, the engine's tiling (choose_tiles) against neighbours: column tiles of 32 and 128
    and twice the K split. Tuning data for the next session: the tiling was chosen without a GPU."""
    from engine.kernels.quant_matmul import choose_tiles

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    notes = []
    for name, out, cols in LLAMA3_8B_LINEARS:
        x = torch.randn(1, cols, device=device, dtype=torch.bfloat16)
        for label, group in (("int8", None), ("int4/g32", 32)):
            weights = [quantized(out, cols, group, device, seed) for seed in range(_copies(out, cols, group))]
            base = choose_tiles(1, out, cols, group, sms)
            k_blocks = -(-cols // base.block_k)
            variants = {"chosen": base, "n32": dataclasses.replace(base, block_n=32),
                        "n128": dataclasses.replace(base, block_n=128),
                        "split x2": dataclasses.replace(base, split_k=min(2 * base.split_k, k_blocks))}
            cells = []
            for what, tiles in variants.items():
                calls = [functools.partial(matmul, x, w, group, tiles=tiles) for w in weights]
                seconds = _time(device, calls)
                cells.append(f"{what} {seconds * 1e6:,.1f} us")
            notes.append(f"decode tiling Llama-3-8B {name} {label} (chosen: n {base.block_n}, "
                         f"k {base.block_k}, split {base.split_k}, {sms} SMs): " + "; ".join(cells))
            del weights
    return notes


def engine_supports_quantization() -> bool:
    from engine.config import EngineConfig

    return any(f.name == "quantization" for f in dataclasses.fields(EngineConfig))


def resident_weight_bytes(engine) -> int:
    """Bytes a decode step reads of the weights: parameters and buffers (quantized linears hold
    theirs as buffers), less an untied embedding, of which only the batch's rows are read."""
    model = engine.runner.model
    seen = {id(t): t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())}
    total = sum(seen.values())
    if not engine.model_config.tie_word_embeddings:
        emb = model.embed_tokens.weight
        total -= emb.numel() * emb.element_size()
    return total


def _nbytes(out: int, cols: int, group: int | str | None) -> int:
    """Bytes of one weight: int8 (None), int4 of a group (int), or bf16 ("bf16")."""
    if group is None:
        return out * cols + out * 4
    if group == "bf16":
        return out * cols * 2
    return out * cols // 2 + 2 * out * (cols // group) * 4


def _copies(out: int, cols: int, group: int | str | None) -> int:
    """How many copies of a weight cycle so that together they overflow the L2."""
    return max(1, min(32, -(-_L2_SPAN // _nbytes(out, cols, group))))


def _time(device: torch.device, calls: list[Callable[[], object]], rounds: int = 5) -> float:
    """GPU seconds per call: the calls captured in one CUDA graph (as the engine's decode runs
    them: no Python launch cost, which would dwarf a 4 MB weight's few microseconds), replayed
    `rounds` times after a warm pass; the best replay over the number of calls."""
    for call in calls:  # compiles the kernels and warms the allocator outside the capture
        call()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - start) / len(calls))
    return best


class _no_tf32:
    """fp32 matmuls at full precision for the reference, whatever the process set."""

    def __enter__(self) -> None:
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.saved
