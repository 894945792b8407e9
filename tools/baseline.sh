#!/usr/bin/env bash
# The project's regression gate on its own data: reruns two small fixed grids on the bundled dump and
# compares each with its committed baseline. A change that makes any estimator's error worse beyond
# the statistical tolerance fails (attnprobe check exits 1).
#   - full mask: every registered estimator's variants with a full form, against data/baselines/synth-demo.csv;
#   - causal mask: every variant with a causal form, against the masked softmax (masked yoso-e for
#     yoso), against data/baselines/synth-demo-causal.csv;
#   - decode rows: the variants that compress a prompt (decode rows only), the last 32 rows of each slice
#     under the causal mask, against data/baselines/synth-demo-decode.csv;
#   - decode rows with rotary frequencies: the variants that read them (`list --variants --prompt --rotary`), on a
#     synthetic dump written here with them (`attnprobe synth --rope-base`), against
#     data/baselines/synth-rope-decode.csv.
#
#   tools/baseline.sh            # check (CTest runs this as the test "baseline_gate")
#   tools/baseline.sh --refresh  # rewrite the baselines after an intended change; commit them with the change
#
# ATTNPROBE (the binary, default build/attnprobe) and BASELINE_WORK (scratch folder, default
# build/baseline) may be set. All 8 slices of the dump at n = 64, 256, 1024, 8 trials: about 4 s
# (full) and 2 s (causal) on 2 cores. Gated metrics: spec_rel, fro_rel, mse, angle, zero_rows (the
# absolute spec and fro are the relative ones times a constant of the fixed reference; nmse and maxabs
# add little and double the baseline file).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
work=${BASELINE_WORK:-build/baseline}
mkdir -p "$work"

# gate NAME DUMP MASK LENGTHS QUERIES LIST-FLAGS...: sweeps the settings `attnprobe list LIST-FLAGS` prints (the
# registry's: each estimator's default, each other choice of its choice keys, and its declared ablations, so a new
# estimator or causal form is gated by registering it) on DUMP and checks or refreshes data/baselines/NAME.csv.
gate() {
  local name=$1 dump=$2 mask=$3 lengths=$4 queries=$5
  shift 5
  local baseline=data/baselines/$name.csv estimators args=()
  mapfile -t estimators < <("$bin" list "$@")
  [ ${#estimators[@]} -gt 0 ] || { echo "baseline: 'attnprobe list $*' printed nothing" >&2; exit 1; }
  for e in "${estimators[@]}"; do args+=(-e "$e"); done
  "$bin" sweep "$dump" "${args[@]}" --mask "$mask" --lengths "$lengths" --queries "$queries" \
    --trials 8 --seed 0 \
    --metrics spec_rel,fro_rel,mse,angle,zero_rows \
    --overwrite -q -o "$work/$name.csv"
  if [ "$refresh" = 1 ]; then
    mkdir -p "$(dirname "$baseline")"
    "$bin" summarize "$work/$name.csv" -o "$baseline"
    echo "baseline: refreshed $baseline; commit it together with the change that moved it"
  else
    echo "baseline: $name ($mask mask)"
    "$bin" check "$work/$name.csv" --baseline "$baseline" --improvements --json "$work/$name.check.json"
  fi
}

refresh=0
[ "${1:-}" = "--refresh" ] && refresh=1
gate synth-demo data/synth-demo.h5 full 64,256,1024 all --variants --full
gate synth-demo-causal data/synth-demo.h5 causal 64,256,1024 all --variants --causal
gate synth-demo-decode data/synth-demo.h5 causal 256,1024 last:32 --variants --prompt
# The settings that read a dump's rotary frequencies (expected(stats=rope)), on a synthetic dump that gives them.
"$bin" synth -o "$work/synth-rope.h5" --layers 1 --heads 4 --kv-heads 2 --batch 1 --tokens 1024 --dim 32 \
  --temperatures 0.3 --rope-base 10000 --seed 0 >/dev/null
gate synth-rope-decode "$work/synth-rope.h5" causal 256,1024 last:32 --variants --prompt --rotary
