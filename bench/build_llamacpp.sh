#!/usr/bin/env bash
# Build llama.cpp's llama-batched-bench and llama-server from the sources vendored in the
# llama-cpp-python sdist (PyPI ships no llama.cpp binaries), for the side-by-side rows of
# bench/engine_cpu.py. Idempotent: does nothing when both binaries exist.
#
#   bench/build_llamacpp.sh            # build (about 15 minutes on 2 cores)
#   PYTHON=/path/to/python bench/build_llamacpp.sh
#
# Needs cmake and a C++ compiler (Debian/Ubuntu: apt-get install -y cmake g++ make).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${LLAMACPP_DIR:-$here/.llamacpp}"
python="${PYTHON:-$(command -v python3 || command -v python)}"
jobs="${JOBS:-2}"
bin="$root/build/bin"

if [[ -x "$bin/llama-batched-bench" && -x "$bin/llama-server" ]]; then
    echo "llama.cpp already built:"
    echo "  $bin/llama-batched-bench"
    echo "  $bin/llama-server"
    exit 0
fi

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null || missing+=(g++)
command -v make >/dev/null || command -v ninja >/dev/null || missing+=(make)
if ((${#missing[@]})); then
    echo "missing build tools: ${missing[*]}" >&2
    echo "install them first, e.g.: apt-get install -y cmake g++ make" >&2
    exit 2
fi

mkdir -p "$root/dist"
sdist="$(ls "$root"/dist/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1 || true)"
if [[ -z "$sdist" ]]; then
    echo "fetching the llama-cpp-python sdist into $root/dist"
    "$python" -m pip download --no-deps --no-binary :all: --dest "$root/dist" llama-cpp-python
    sdist="$(ls "$root"/dist/llama_cpp_python-*.tar.gz | head -n1)"
fi

src="$root/src"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
    rm -rf "$src" && mkdir -p "$src"
    tar -xzf "$sdist" -C "$src" --strip-components=1
fi
llama="$src/vendor/llama.cpp"
[[ -f "$llama/CMakeLists.txt" ]] || { echo "no vendored llama.cpp in $sdist" >&2; exit 1; }

# Native build (this machine's AVX-512/VNNI), no network features.
cmake -S "$llama" -B "$root/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$bin"
# The bench needs llama-batched-bench alone: build it first, then the server.
cmake --build "$root/build" --target llama-batched-bench -j"$jobs"
cmake --build "$root/build" --target llama-server -j"$jobs"

echo "llama.cpp built:"
echo "  $bin/llama-batched-bench"
echo "  $bin/llama-server"
