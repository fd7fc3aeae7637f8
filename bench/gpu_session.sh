#!/usr/bin/env bash
# Everything a lent GPU session needs to check, in one call of the device tool (see docs/BENCHMARKS.md):
#   run(command="bash bench/gpu_session.sh", timeout_s=580)
# 1. the kernel and runner tests natively on CUDA (bf16 included), 2. bench/engine_gpu.py: each kernel
# against the torch reference at realistic shapes, then the benchmark table. Output goes to $OUT:
# env.txt, pytest.txt + pytest.xml (JUnit: every test's outcome and failure text), bench.txt, and
# status.txt (each step's exit code), whatever fails.
# The H200 image has torch, triton, transformers, jinja2, tokenizers, safetensors and pytest, which
# is all the engine needs; nothing is installed.
#
# BENCH_PHASES (comma-separated, default all) picks the benchmark's phases, e.g.
#   BENCH_PHASES="kernel checks,copy bandwidth,quantized" for the quantized rows alone.
#
# Time: the whole script stays within SESSION_S seconds (default 540, under the call's timeout_s).
# The tests get at most PYTEST_S (150) s: then SIGINT, on which pytest still prints its summary
# (SIGKILL 10 s later if it does not stop); the benchmark gets what is left (at most 360 s) as its
# --budget, and an outer `timeout` 20 s past that. Each benchmark phase runs in a process of its
# own, and killed by that timeout the benchmark still prints the report so far.
set -u
OUT=${OUT:-/tmp/gpu-session}
SESSION_S=${SESSION_S:-540}
PYTEST_S=${PYTEST_S:-150}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# HOME may not be writable on the device image (Triton caches compiled kernels under ~/.triton),
# and nothing outside the machine can be reached (no hub look-ups that wait on a network timeout).
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
# The interpreter that has torch and triton (python3 on the image; `python` where only that has them).
# find_spec imports nothing: no seconds spent importing torch just to pick the interpreter.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in python3 python; do
        if "$candidate" -c 'import importlib.util as u, sys
sys.exit(0 if u.find_spec("torch") and u.find_spec("triton") else 1)' >/dev/null 2>&1; then
            PY=$candidate
            break
        fi
    done
    PY=${PY:-python3}
fi
: > "$OUT/status.txt"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c 'import sys, numpy, torch, triton, transformers; print(sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, "transformers", transformers.__version__, "numpy", numpy.__version__)'
  echo "TRITON_CACHE_DIR=$TRITON_CACHE_DIR"; } 2>&1 | tee "$OUT/env.txt"
# These engine tests need none of the repo's pytest plugins (the image has no pytest-asyncio).
# No -x: one tolerance miss must not hide the other results of the only GPU session. -v: each
# test's name is printed as it starts, so a hang shows where. Python started with SIGINT ignored
# (as a background job of a non-interactive shell is) would ignore the timeout's SIGINT: the
# wrapper restores the KeyboardInterrupt handler, on which pytest prints its summary and the XML.
timeout -s INT -k 10 "$PYTEST_S" "$PY" -c 'import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import pytest
sys.exit(pytest.main(sys.argv[1:]))' -v -rfE --durations=15 -p no:cacheprovider \
    --junitxml="$OUT/pytest.xml" \
    tests/engine/test_triton_attention.py tests/engine/test_triton_kernels.py \
    tests/engine/test_runner_inputs.py tests/engine/test_sampler.py \
    tests/engine/test_tool_choice_devices.py tests/engine/test_quant_matmul.py 2>&1 | tee "$OUT/pytest.txt"
rc=${PIPESTATUS[0]}
echo "pytest exit code $rc$( [ "$rc" = 124 ] && echo " (timed out after ${PYTEST_S}s: SIGINT)")" \
    | tee -a "$OUT/status.txt"
left=$((SESSION_S - SECONDS - 25))
budget=$((left < 360 ? left : 360))
if [ "$budget" -lt 60 ]; then
    echo "bench/engine_gpu.py skipped: ${left}s left of SESSION_S=${SESSION_S}" | tee "$OUT/bench.txt"
    echo "bench skipped" >> "$OUT/status.txt"
    exit 1
fi
echo "bench/engine_gpu.py --budget $budget (${SECONDS}s used so far)"
timeout -k 5 $((budget + 20)) "$PY" bench/engine_gpu.py --budget "$budget" ${BENCH_PHASES:+--phases "$BENCH_PHASES"} \
    2>&1 | tee "$OUT/bench.txt"
rc=${PIPESTATUS[0]}
echo "bench exit code $rc (${SECONDS}s in all)" | tee -a "$OUT/status.txt"
exit "$rc"
