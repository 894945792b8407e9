#!/usr/bin/env bash
# Configures and builds attnprobe (Release) into ./build.
#   tools/build.sh [--target NAME]... [cmake configure arguments]
# --target builds only that target and what it needs (tools/run_demo.sh: --target attnprobe, the CLI, without the
# tests and the Python module); without it, everything. The other arguments go to cmake's configure, e.g.
# -DATTNPROBE_CUDA=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
while [ $# -gt 0 ] && [ "$1" = --target ]; do
  [ $# -ge 2 ] || { echo "build.sh: --target needs a target name (e.g. attnprobe)" >&2; exit 2; }
  targets+=(--target "$2")
  shift 2
done
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)" "${targets[@]}"
