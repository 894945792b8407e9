#!/usr/bin/env bash
# A sharded attnprobe sweep on Slurm: one job array whose task I runs `sweep --shard I/N` into its own
# CSV, and a merge job that starts when every task has succeeded (--dependency=afterok) and joins
# them into the CSV a single-process run would write. Any job-array engine can do the same: run
# `attnprobe sweep ARGS --shard $INDEX/$COUNT --resume -o DIR/shard-$INDEX.csv` for INDEX = 0..COUNT-1,
# then `attnprobe merge -o DIR/sweep.csv DIR/shard-*.csv` (docs/cli.md, "Beyond one machine").
#
# Usage (on the login node, from a shared file system):
#   tools/slurm_sweep.sh submit COUNT DIR [SBATCH_OPTION...] -- DUMP SWEEP_OPTION...
#     e.g. tools/slurm_sweep.sh submit 16 out/run1 --time=04:00:00 --cpus-per-task=8 -- \
#            model.h5 -e softmax -e 'yoso(m=32)' --lengths 512..32768:x2 --trials 32
#   Prints the two job ids. Results: DIR/sweep.csv (+ DIR/sweep.csv.run.json); logs: DIR/logs/.
# What the jobs run (not called by hand):
#   tools/slurm_sweep.sh task COUNT DIR -- DUMP SWEEP_OPTION...   (one array task)
#   tools/slurm_sweep.sh merge COUNT DIR                          (the dependent job)
# Environment: ATTNPROBE (default: attnprobe on PATH, else ./build/attnprobe), SBATCH (default sbatch).
# A task is idempotent: it runs with --resume, so a requeued or preempted task (sbatch --requeue)
# continues its shard; resubmitting the same command completes whatever is missing.
set -euo pipefail

script=$(readlink -f "$0")
here=$(cd "$(dirname "$script")/.." && pwd)
attnprobe=${ATTNPROBE:-$(command -v attnprobe || echo "$here/build/attnprobe")}
sbatch=${SBATCH:-sbatch}

usage() {
  sed -n '2,22p' "$script" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -ge 3 ] || usage
mode=$1
count=$2
dir=$3
shift 3
[[ "$count" =~ ^[1-9][0-9]*$ ]] || { echo "slurm_sweep: COUNT must be a positive integer, not '$count'" >&2; exit 2; }

case "$mode" in
submit)
  sbatch_options=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    sbatch_options+=("$1")
    shift
  done
  [ "${1:-}" = "--" ] || { echo "slurm_sweep: put -- before the sweep's DUMP and options" >&2; exit 2; }
  shift
  [ $# -ge 1 ] || usage
  # Validate the grid now (seconds), not when the array starts (hours later).
  if ! check=$("$attnprobe" sweep "$@" --shard "0/$count" --dry-run -o "$dir/shard-0.csv" 2>&1); then
    echo "$check" >&2
    exit 2
  fi
  mkdir -p "$dir/logs"
  array=$("$sbatch" --parsable --job-name=attnprobe-sweep --array="0-$((count - 1))" \
    --output="$dir/logs/shard-%a.log" "${sbatch_options[@]}" "$script" task "$count" "$dir" -- "$@")
  array=${array%%;*}  # --parsable prints JOBID[;CLUSTER]
  merge=$("$sbatch" --parsable --job-name=attnprobe-merge --dependency="afterok:$array" \
    --output="$dir/logs/merge.log" "$script" merge "$count" "$dir")
  echo "submitted: array job $array ($count shards), merge job ${merge%%;*} -> $dir/sweep.csv"
  ;;
task)
  [ "${1:-}" = "--" ] || usage
  shift
  index=${SLURM_ARRAY_TASK_ID:?slurm_sweep task: SLURM_ARRAY_TASK_ID is not set (run it through submit)}
  if [ -n "${SLURM_ARRAY_TASK_COUNT:-}" ] && [ "$SLURM_ARRAY_TASK_COUNT" != "$count" ]; then
    echo "slurm_sweep: the array has $SLURM_ARRAY_TASK_COUNT tasks but the sweep was split into $count" >&2
    exit 2
  fi
  exec "$attnprobe" sweep "$@" --shard "$index/$count" --threads "${SLURM_CPUS_PER_TASK:-0}" --resume -q \
    -o "$dir/shard-$index.csv"
  ;;
merge)
  shards=()
  for ((i = 0; i < count; ++i)); do shards+=("$dir/shard-$i.csv"); done
  exec "$attnprobe" merge --overwrite -o "$dir/sweep.csv" "${shards[@]}"
  ;;
*)
  usage
  ;;
esac
