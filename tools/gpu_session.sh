#!/usr/bin/env bash
# One whole device session (run on the lent GPU machine from the repository root, after
# tools/gpu_pack.sh packed .devrun here; `bash .devrun/tools/gpu_session.sh`): the device's ceilings, the [gpu] parity tests, the
# kernel-level bench (device-resident, CUDA events), `attnprobe bench --device cuda` (per call,
# with transfers) and a sweep of the bundled dumps on the GPU against 2 CPU threads. Logs go to
# $OUT (default ./out/gpu): session.log (all of the console), tests.log, kbench.csv, bench.csv, bench_causal.csv,
# kbench_decode.csv, sweep.txt, sweep_decode.txt (few files: the device tool brings back at most 8). STEPS picks
# steps (default all):
#   STEPS="info ceilings tests kbench decode bench sweep sweep_decode" tools/gpu_session.sh
set -uo pipefail
root=$(pwd)
here=$(cd "$(dirname "$0")" && pwd)
run=${DEVRUN:-$(cd "$here/.." && pwd)}
out=${OUT:-$root/out/gpu}
mkdir -p "$out"
exec > >(tee -a "$out/session.log") 2>&1
export LD_LIBRARY_PATH="$run/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
steps=${STEPS:-info ceilings tests kbench decode bench sweep sweep_decode}
has() { [[ " $steps " == *" $1 "* ]]; }
stamp() { echo "== $1 $(date +%T)"; }
if has info; then
  stamp info
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv
  nvcc --version | tail -1
  nproc
fi
if has ceilings; then
  stamp ceilings
  timeout 120 python3 "$here/gpu_ceilings.py"
fi
if has tests; then
  stamp tests
  # The test binary runs the CLI at the path it was built with (a worktree here): point that path
  # at this checkout and the carried binary.
  wt=${ATTNPROBE_BUILD_SOURCE:-/work/wt-gpu}
  if [ ! -e "$wt" ]; then mkdir -p "$(dirname "$wt")" && ln -s "$root" "$wt"; fi
  mkdir -p "$wt/build-dev" && ln -sf "$run/bin/attnprobe" "$wt/build-dev/attnprobe"
  timeout 200 "$run/bin/attnprobe_tests" "[gpu]" --durations yes ${TEST_ARGS:-} >"$out/tests.log" 2>&1
  echo "tests rc $?"
  grep -E "passed|failed|FAILED|with expansion|cpu .* gpu|seconds" "$out/tests.log" | tail -40
fi
if has kbench && [ -x "$run/bin/attnprobe_gpu_bench" ]; then
  stamp kbench
  timeout 300 "$run/bin/attnprobe_gpu_bench" ${KBENCH_ARGS:-} --csv "$out/kbench.csv"
fi
if has decode && [ -x "$run/bin/attnprobe_gpu_bench" ]; then
  stamp decode
  # Decode attention (1-64 rows against 65536 to 1M keys, GQA) beside the read bandwidth of the same K and V.
  timeout 300 "$run/bin/attnprobe_gpu_bench" --decode-only ${DECODE_ARGS:-} --csv "$out/kbench_decode.csv"
fi
if has bench; then
  stamp bench
  timeout 240 "$run/bin/attnprobe" bench --device cuda --no-sgemm --threads 1 --repeat 3 \
    --lengths "${BENCH_LENGTHS:-4096,16384,65536}" -e softmax -e vmean -e "yoso-e" -e yoso -e performer -e linformer -e informer -e skeinformer \
    --csv "$out/bench.csv"
  # The causal forms on the device (the rows go to the same CSV's mask column).
  timeout 120 "$run/bin/attnprobe" bench --device cuda --mask causal --no-sgemm --threads 1 --repeat 3 \
    --lengths "${BENCH_LENGTHS:-4096,16384,65536}" -e softmax -e vmean -e performer --csv "$out/bench_causal.csv"
fi
if has sweep; then
  stamp sweep
  # Every estimator with a CUDA version over every bundled dump, GPU vs 2 CPU threads (the float64
  # softmax reference on the device's fp64 kernel with --device cuda, on the CPU with --device cpu);
  # then the two CSVs compared row by row.
  est=(-e softmax -e vmean -e yoso-e -e yoso -e performer -e linformer -e linformer-jlt -e informer -e skeinformer)
  for dump in data/*.h5; do
    name=$(basename "$dump" .h5)
    for device in cuda cpu; do
      start=$(date +%s.%N)
      timeout 240 "$run/bin/attnprobe" sweep "$dump" "${est[@]}" --trials "${SWEEP_TRIALS:-4}" --threads 2 \
        --device "$device" -q --overwrite -o "/tmp/sweep_${name}_$device.csv" >/dev/null
      echo "sweep $name $device rc $? seconds $(awk "BEGIN{print $(date +%s.%N) - $start}")"
    done
    python3 "$here/compare_sweeps.py" "/tmp/sweep_${name}_cuda.csv" "/tmp/sweep_${name}_cpu.csv"
  done | tee "$out/sweep.txt"
  # The causal forms on the device, on our causal model's dump: the float64 causal reference from the
  # device's fp64 kernel with --device cuda.
  for dump in data/*.safetensors; do
    name=$(basename "$dump" .safetensors)
    for device in cuda cpu; do
      start=$(date +%s.%N)
      timeout 240 "$run/bin/attnprobe" sweep "$dump" -e softmax -e vmean -e yoso-e -e performer --mask causal \
        --trials "${SWEEP_TRIALS:-4}" --threads 2 --device "$device" -q --overwrite -o "/tmp/sweep_${name}_$device.csv" >/dev/null
      echo "causal sweep $name $device rc $? seconds $(awk "BEGIN{print $(date +%s.%N) - $start}")"
    done
    python3 "$here/compare_sweeps.py" "/tmp/sweep_${name}_cuda.csv" "/tmp/sweep_${name}_cpu.csv"
  done | tee -a "$out/sweep.txt"
fi
if has sweep_decode; then
  stamp sweep_decode
  # Decode steps of our causal model (the last 16 and 64 rows against the rest as their cache): softmax's
  # decode form and the device's float64 decode reference against 2 CPU threads.
  for dump in data/*.safetensors; do
    name=$(basename "$dump" .safetensors)
    for device in cuda cpu; do
      start=$(date +%s.%N)
      timeout 240 "$run/bin/attnprobe" sweep "$dump" -e softmax --mask causal --queries last:16,last:64 \
        --threads 2 --device "$device" -q --overwrite -o "/tmp/decode_${name}_$device.csv" >/dev/null
      echo "decode sweep $name $device rc $? seconds $(awk "BEGIN{print $(date +%s.%N) - $start}")"
    done
    python3 "$here/compare_sweeps.py" "/tmp/decode_${name}_cuda.csv" "/tmp/decode_${name}_cpu.csv"
  done | tee "$out/sweep_decode.txt"
fi
stamp done
