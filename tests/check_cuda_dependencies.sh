#!/usr/bin/env bash
# Every CUDA source of the library compiles without Eigen: its kernels see the CUDA runtime, Philox and a
# plain params struct only (lib/attnprobe/gpu/README.md). Reads the dependency file nvcc wrote beside each
# object (.cu.o.d) and fails, naming the source and the first Eigen header it pulls in.
# Usage: check_cuda_dependencies.sh SOURCE_DIR OBJECT_DIR   (OBJECT_DIR: .../lib/CMakeFiles/attnprobe_cuda.dir)
set -euo pipefail
source_dir=$1
object_dir=$2
cd "$source_dir/lib"
checked=0
bad=0
while IFS= read -r source; do
  deps="$object_dir/$source.o.d"
  if [ ! -f "$deps" ]; then
    echo "FAIL: no dependency file $deps for $source (was it built?)"
    bad=1
    continue
  fi
  eigen=$(grep -m1 -o '[^ ]*[Ee]igen[^ ]*' "$deps" || true)
  if [ -n "$eigen" ]; then
    echo "FAIL: $source depends on Eigen ($eigen): keep Eigen in the host adapter (<name>_cuda.cpp)"
    bad=1
  fi
  checked=$((checked + 1))
done < <(find attnprobe -name '*.cu' | sort)
[ "$checked" -gt 0 ] || { echo "FAIL: no .cu sources found under $source_dir/lib"; exit 1; }
[ "$bad" -eq 0 ] || exit 1
echo "ok: $checked CUDA sources, none depends on Eigen"
