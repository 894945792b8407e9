#!/usr/bin/env bash
# Builds the device build (build-dev: sm_90 only, no -march=native since the device's CPU is not
# this one) and packs what tools/gpu_session.sh needs into DEST (default: .devrun in this checkout;
# from a worktree, pass the session checkout's, e.g. /work/main/.devrun, since the device tool sends
# that one): stripped binaries in bin/, the libraries they load beyond glibc and the CUDA driver
# (libattnprobe, HDF5, fmt, ...) in lib/, the session scripts in tools/. Then, with the device tool:
#   run(command="bash .devrun/tools/gpu_session.sh", carry=[".devrun"])
# Usage: [NO_BUILD=1] tools/gpu_pack.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-$(pwd)/.devrun}
if [ -z "${NO_BUILD:-}" ]; then
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DATTNPROBE_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DATTNPROBE_CUDA=ON >/dev/null
targets=(attnprobe attnprobe_tests)
targets+=(attnprobe_gpu_bench)
cmake --build build-dev --target "${targets[@]}" -j2
fi
rm -rf "$dest" && mkdir -p "$dest/bin" "$dest/lib"
for t in attnprobe tests/attnprobe_tests attnprobe_gpu_bench; do
  [ -f "build-dev/$t" ] || continue
  cp "build-dev/$t" "$dest/bin/" && strip "$dest/bin/$(basename "$t")"
  # Everything outside glibc/libstdc++/the CUDA driver travels (the device image has CUDA 13 and a
  # compiler runtime, but not Debian's HDF5, fmt or OpenBLAS).
  ldd "build-dev/$t" | awk '/=> \//{print $3}' |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux|libcuda)[.-]' |
    while read -r so; do cp -L "$so" "$dest/lib/"; done
done
strip "$dest"/lib/*.so* 2>/dev/null || true
mkdir -p "$dest/tools" && cp tools/gpu_session.sh tools/gpu_ceilings.py tools/compare_sweeps.py "$dest/tools/"
du -sh "$dest"
