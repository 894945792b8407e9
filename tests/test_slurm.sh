#!/usr/bin/env bash
# tools/slurm_sweep.sh without a cluster: a stand-in `sbatch` runs the array's tasks one after the
# other with the variables Slurm sets (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT), then the merge
# job; the merged CSV must equal a single-process sweep's byte for byte.
# Usage: test_slurm.sh ATTNPROBE_BINARY SOURCE_DIR
set -euo pipefail
bin=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
cat >sbatch <<'STUB'
#!/usr/bin/env bash
# Stand-in for sbatch: options up to the script, then the script and its arguments.
array=""
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do
  case "$1" in --array=*) array=${1#--array=} ;; esac
  shift
done
echo "sbatch: $* (array: ${array:-none})" >>sbatch.log
if [ -n "$array" ]; then
  first=${array%-*}
  last=${array#*-}
  for ((i = first; i <= last; ++i)); do
    SLURM_ARRAY_TASK_ID=$i SLURM_ARRAY_TASK_COUNT=$((last - first + 1)) "$@" >>"tasks.log" 2>&1
  done
else
  "$@" >>"tasks.log" 2>&1
fi
echo "$RANDOM"
STUB
chmod +x sbatch
"$bin" synth -o d.h5 --layers 2 --heads 2 --batch 1 --tokens 80 --dim 8 >/dev/null
grid=(d.h5 -e vmean -e 'yoso(m=4)' --lengths 16,80,48 --trials 2 --seed 11)
"$bin" sweep "${grid[@]}" -q -o single.csv
ATTNPROBE=$bin SBATCH=./sbatch "$source_dir/tools/slurm_sweep.sh" submit 3 out --time=00:10:00 -- "${grid[@]}"
cat tasks.log
grep -q "shard 2/3" tasks.log || { echo "FAIL: shard 2/3 did not run"; exit 1; }
cmp single.csv out/sweep.csv || { echo "FAIL: the merged Slurm shards differ from one process"; exit 1; }
echo "ok: 3 array tasks + merge == one process ($(wc -l <out/sweep.csv) lines)"
