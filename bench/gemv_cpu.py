"""The quantized linears of one decode (or prefill) step of the embedded model, per kernel.

    python bench/gemv_cpu.py [--threads 1,2] [--rows 1,4,16,512] [--repeats 5]

Times the 120 linears of SmolLM2-135M (30 layers of qkv 960x576, o 576x576, gate_up 3072x576,
down 576x1536) plus the 49152x576 LM head on random weights, as one step, per kernel:
oneDNN fp32 (today's `quantization=None`), fbgemm fp16 weights (the previous CPU "auto"), and
engine/native/gemv.cpp (int4 groups of 32 with an int8 head; fp32 activations, and the
int8-activation VNNI tier), for decode as it is and, for prefill, both through the kernel and
dequantize-then-oneDNN/F.linear. Prints ms per step and the weight bytes streamed per second (the
machine's copy bandwidth is the ceiling). At one thread the clock is the thread's CPU time, which
other jobs on a shared machine do not inflate."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.layers.linear import PackedLinear  # noqa: E402
from engine.layers.quant import quantize_int4, quantize_int8  # noqa: E402
from engine.native import gemv  # noqa: E402

LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))
HEAD = (49152, 576)


def weights(layers: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    body = [torch.randn(shape, generator=gen) * 0.02 for _ in range(layers) for shape in LAYER]
    return body, torch.randn(HEAD, generator=gen) * 0.02


def best_ms(step, repeats: int) -> float:
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    step()
    times = []
    for _ in range(repeats):
        t0 = clock()
        step()
        times.append(clock() - t0)
    return 1e3 * min(times)


def systems(body: list[torch.Tensor], head: torch.Tensor):
    """name -> (step(rows) callable factory, weight bytes)."""
    lib = gemv.kernels()
    packed = [PackedLinear(nn.Linear(w.shape[1], w.shape[0], bias=False)) for w in (*body, head)]
    for p, w in zip(packed, (*body, head), strict=True):
        p.weight = torch.ops.mkldnn._reorder_linear_weight(w, None)
    fp16 = [torch.ops.quantized.linear_prepack_fp16(w, None) for w in (*body, head)]
    q4 = []
    for w in body:
        q, s, o = quantize_int4(w, 32)
        q4.append((gemv.repack_int4(q), s, o))
    q8 = quantize_int8(head)

    def run_fp32(x):
        for p in packed:
            p(x[p.in_features])

    def run_fp16(x):
        for p, w in zip(fp16, (*body, head), strict=True):
            torch.ops.quantized.linear_dynamic_fp16(x[w.shape[1]], p)

    def run_native(x):
        for q, s, o in q4:
            gemv.int4_linear(lib, x[q.shape[1] * 2], q, s, o, 32, None)
        gemv.int8_linear(lib, x[head.shape[1]], *q8, None)

    def run_native_q8(x):
        for q, s, o in q4:
            gemv.int4_linear_q8(lib, x[q.shape[1] * 2], q, s, o, None)
        gemv.int8_linear(lib, x[head.shape[1]], *q8, None)

    def run_dequant_onednn(x):
        for q, s, o in q4:
            w = gemv.int4_dequantize(lib, q, s, o, 32)
            torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], w, None, "none", [], "")
        w = gemv.int8_dequantize(lib, *q8)
        torch.ops.mkldnn._linear_pointwise(x[head.shape[1]], w, None, "none", [], "")

    def run_dequant_mkl(x):
        for q, s, o in q4:
            torch.nn.functional.linear(x[q.shape[1] * 2], gemv.int4_dequantize(lib, q, s, o, 32))
        torch.nn.functional.linear(x[head.shape[1]], gemv.int8_dequantize(lib, *q8))

    n_body = sum(w.numel() for w in body)
    bytes_fp32 = 4 * (n_body + head.numel())
    bytes_q = n_body // 2 + 8 * n_body // 32 + head.numel() + 4 * head.shape[0]
    return {"oneDNN fp32": (run_fp32, bytes_fp32), "fbgemm fp16": (run_fp16, bytes_fp32 // 2),
            "native int4+int8 head": (run_native, bytes_q),
            "native, int8 activations": (run_native_q8, bytes_q),
            "dequantize + oneDNN": (run_dequant_onednn, bytes_q),
            "dequantize + F.linear": (run_dequant_mkl, bytes_q)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,4,16,512")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if gemv.kernels() is None:
        sys.exit("the native gemv kernels did not load (see the log)")
    body, head = weights(args.layers)
    with torch.inference_mode():
        table = systems(body, head)
        print(f"load average {os.getloadavg()[0]:.2f}; {args.layers} layers + head; "
              "ms per step (GB/s of weights)")
        for threads in map(int, args.threads.split(",")):
            torch.set_num_threads(threads)
            for rows in map(int, args.rows.split(",")):
                x = {k: torch.randn(rows, k) for k in (576, 1536)}
                cells = []
                for name, (step, nbytes) in table.items():
                    if rows <= 16 and name.startswith("dequantize"):
                        continue
                    ms = best_ms(lambda step=step, x=x: step(x), args.repeats if rows <= 16 else 2)
                    cells.append(f"{name} {ms:.1f} ({nbytes / ms / 1e6:.1f})")
                print(f"threads {threads} rows {rows:4d}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
