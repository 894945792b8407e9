#!/usr/bin/env bash
# The scale-out benchmark (docs/cli.md, "MPI"): one sweep of both bundled long dumps, lengths
# 64..4096, five estimators, run as `mpirun -n 2` × 1 thread, 1 process × 2 threads and 1 × 1, each
# twice; prints the best wall time and CPU time of each and their ratios, and checks that the three
# CSVs are identical. Run it on a quiet machine: wall-clock ratios are only meaningful there.
#   tools/bench_mpi.sh [build/attnprobe]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/attnprobe}
command -v mpirun >/dev/null || { echo "bench_mpi: no mpirun (apt-get install openmpi-bin)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(-e softmax -e 'yoso(m=32)' -e 'performer(M=64)' -e 'skeinformer(d=64)' -e vmean --lengths 64..4096:x2
      --trials 4 -q --overwrite)
mpi=(mpirun -n 2 --bind-to none --oversubscribe)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
echo "host: $(nproc) cores; $(uptime)"
run() {  # NAME THREADS LAUNCHER...
  local name=$1 threads=$2
  shift 2
  local t0 t1
  t0=$(date +%s.%N)
  for d in charlm-hd32 charlm-hd64; do
    /usr/bin/time -f "%U %S" -a -o "$work/cpu-$name" "$@" "$bin" sweep "data/$d.h5" "${args[@]}" --threads "$threads" \
      -o "$work/$name-$d.csv"
  done
  t1=$(date +%s.%N)
  echo "$name $(/usr/bin/python3 -c "print($t1 - $t0)") $(awk '{s += $1 + $2} END {print s}' "$work/cpu-$name")" >> "$work/times"
  rm -f "$work/cpu-$name"
}
for rep in 1 2; do
  run mpi2x1 1 "${mpi[@]}"
  run 1x2 2 env
  run 1x1 1 env
done
for d in charlm-hd32 charlm-hd64; do
  cmp -s "$work/mpi2x1-$d.csv" "$work/1x1-$d.csv" && cmp -s "$work/1x2-$d.csv" "$work/1x1-$d.csv" &&
    echo "$d: identical CSVs for the three runs" || { echo "$d: the CSVs differ"; exit 1; }
done
/usr/bin/python3 - "$work/times" <<'PY'
import collections, sys
wall, cpu = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, w, c = line.split()
    wall[name].append(float(w)); cpu[name].append(float(c))
best = {k: min(v) for k, v in wall.items()}
for k in ("mpi2x1", "1x2", "1x1"):
    print(f"{k:7} wall {best[k]:7.2f} s   cpu {min(cpu[k]):7.2f} s")
print(f"1x1/mpi2x1 = {best['1x1'] / best['mpi2x1']:.3f}   1x1/1x2 = {best['1x1'] / best['1x2']:.3f}   "
      f"mpi2x1/1x2 = {best['mpi2x1'] / best['1x2']:.3f} (MPI's wall time over the threaded run's)")
PY
