#!/usr/bin/env bash
# Everything a lent GPU session needs to check, in one call of the device tool (see docs/BENCHMARKS.md):
#   run(command="bash bench/gpu_session.sh", timeout_s=560)
# 1. the kernel and runner tests natively on CUDA (bf16 included), 2. bench/engine_gpu.py: each kernel
# against the torch reference at realistic shapes, then the benchmark table. Output goes to $OUT.
# The H200 image has torch, triton, transformers, jinja2, tokenizers, safetensors and pytest, which
# is all the engine needs; nothing is installed.
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c 'import sys, torch, triton, transformers; print(sys.version.split()[0], "torch", torch.__version__,
"triton", triton.__version__, "transformers", transformers.__version__)'; } 2>&1 | tee "$OUT/env.txt"
# These engine tests need none of the repo's pytest plugins (the image has no pytest-asyncio).
timeout 150 "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/engine/test_triton_attention.py tests/engine/test_triton_kernels.py \
    tests/engine/test_runner_inputs.py tests/engine/test_sampler.py 2>&1 | tee "$OUT/pytest.txt"
timeout 420 "$PY" bench/engine_gpu.py 2>&1 | tee "$OUT/bench.txt"
