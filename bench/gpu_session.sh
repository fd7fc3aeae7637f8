#!/usr/bin/env bash
# Everything a lent GPU session needs to check, in one call of the device tool (see docs/BENCHMARKS.md):
#   run(command="bash bench/gpu_session.sh", timeout_s=580)
# 1. the kernel and runner tests natively on CUDA (bf16 included), 2. bench/engine_gpu.py: each kernel
# against the torch reference at realistic shapes, then the benchmark table. Output goes to $OUT.
# The H200 image has torch, triton, transformers, jinja2, tokenizers, safetensors and pytest, which
# is all the engine needs; nothing is installed.
#
# Time: the whole script stays within SESSION_S seconds (default 540, under the call's timeout_s).
# The tests get at most 150 s; the benchmark gets what is left (at most 360 s) as its --budget, and
# an outer `timeout` 20 s past that. Killed by it, the benchmark still prints the report so far.
set -u
OUT=${OUT:-/tmp/gpu-session}
SESSION_S=${SESSION_S:-540}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c 'import sys, numpy, torch, triton, transformers; print(sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, "transformers", transformers.__version__, "numpy", numpy.__version__)'; } 2>&1 | tee "$OUT/env.txt"
# These engine tests need none of the repo's pytest plugins (the image has no pytest-asyncio).
# No -x: one tolerance miss must not hide the other results of the only GPU session.
timeout -k 5 150 "$PY" -m pytest -q -rfE --durations=15 -p no:cacheprovider \
    tests/engine/test_triton_attention.py tests/engine/test_triton_kernels.py \
    tests/engine/test_runner_inputs.py tests/engine/test_sampler.py \
    tests/engine/test_tool_choice_devices.py 2>&1 | tee "$OUT/pytest.txt"
left=$((SESSION_S - SECONDS - 25))
budget=$((left < 360 ? left : 360))
if [ "$budget" -lt 60 ]; then
    echo "bench/engine_gpu.py skipped: ${left}s left of SESSION_S=${SESSION_S}" | tee "$OUT/bench.txt"
    exit 1
fi
echo "bench/engine_gpu.py --budget $budget (${SECONDS}s used so far)"
timeout -k 5 $((budget + 20)) "$PY" bench/engine_gpu.py --budget "$budget" 2>&1 | tee "$OUT/bench.txt"
