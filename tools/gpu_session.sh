#!/usr/bin/env bash
# One whole device session (run on the lent GPU machine from the repository root, after
# tools/gpu_pack.sh packed .devrun here): the device's ceilings, the [gpu] parity tests, the
# kernel-level bench (device-resident, CUDA events) and `attnprobe bench --device cuda` (per call,
# with transfers). Logs go to $OUT (default ./out/gpu). STEPS picks steps (default all):
#   STEPS="info ceilings tests kbench bench sweep" tools/gpu_session.sh
set -uo pipefail
root=$(pwd)
run=${DEVRUN:-$root/.devrun}
out=${OUT:-$root/out/gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH="$run/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
steps=${STEPS:-info ceilings tests kbench bench sweep}
has() { [[ " $steps " == *" $1 "* ]]; }
stamp() { echo "== $1 $(date +%T)" | tee -a "$out/steps.log"; }
if has info; then
  stamp info
  { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv
    nvcc --version | tail -1; nproc; } >"$out/device.txt" 2>&1
  cat "$out/device.txt"
fi
if has ceilings; then
  stamp ceilings
  timeout 120 python3 "$(dirname "$0")/gpu_ceilings.py" 2>&1 | tee "$out/ceilings.txt"
fi
if has tests; then
  stamp tests
  # The test binary runs the CLI at the path it was built with (a worktree here): point that path
  # at this checkout and the carried binary.
  wt=${ATTNPROBE_BUILD_SOURCE:-/work/wt-gpu}
  if [ ! -e "$wt" ]; then mkdir -p "$(dirname "$wt")" && ln -s "$root" "$wt"; fi
  mkdir -p "$wt/build-dev" && ln -sf "$run/bin/attnprobe" "$wt/build-dev/attnprobe"
  timeout 200 "$run/bin/attnprobe_tests" "[gpu]" --durations yes ${TEST_ARGS:-} >"$out/tests.log" 2>&1
  echo "tests rc $?" | tee -a "$out/steps.log"
  grep -E "passed|failed|FAILED|with expansion|cpu .* gpu|seconds" "$out/tests.log" | tail -40
fi
if has kbench && [ -x "$run/bin/attnprobe_gpu_bench" ]; then
  stamp kbench
  timeout 300 "$run/bin/attnprobe_gpu_bench" ${KBENCH_ARGS:-} --csv "$out/kbench.csv" 2>&1 | tee "$out/kbench.txt"
fi
if has bench; then
  stamp bench
  timeout 240 "$run/bin/attnprobe" bench --device cuda --no-sgemm --threads 1 --repeat 3 \
    --lengths "${BENCH_LENGTHS:-4096,16384,65536}" -e softmax -e vmean -e "yoso-e" -e yoso -e performer \
    --csv "$out/bench.csv" 2>&1 | tee "$out/bench.txt"
fi
stamp done
