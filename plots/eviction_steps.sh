#!/usr/bin/env bash
# The replayed evicting caches over decode steps (issue 41): H2O and TOVA decide at every step from the queries seen
# so far, so their kept set drifts as the generation grows; StreamingLLM (4 sinks and a window) and the oracle top-k
# choose per row and do not. The last 16 rows of our causal GQA model's 4096-token slices (and of stories260K's
# 512-token ones, from ../shared/data, when present) with the prompt ended --prefill P earlier, so that
# steps = N - 16 - P decode steps run between the prompt and the first measured row; every method at two key
# budgets B (h2o: B/2 heavy + B/2 window; tova: B - 1 cached + the step's own key; streaming: 4 + B - 4; topk: B).
# Reduced to plots/data/eviction-steps.csv and drawn as plots/figures/eviction-steps.png; the paired comparisons
# of plots/README.md ("Evicting caches over decode steps") are `attnprobe summarize --compare` on these sweeps,
# kept in plots/data/eviction-steps-compare.csv. About 40 s on two shared cores.
#   ATTNPROBE=build/attnprobe plots/eviction_steps.sh
#   plots/eviction_steps.sh --from-data   # no sweeps: redraw the figure from the committed plots/data/
set -euo pipefail
cd "$(dirname "$0")/.."
. plots/from_data.sh
from_data_option eviction_steps.sh "$@"
compare=plots/data/eviction-steps-compare.csv
if [ "$from_data" = 0 ]; then
bin=${ATTNPROBE:-build/attnprobe}
work=${WORK:-out/eviction}
threads=${THREADS:-1}
mkdir -p "$work"
rm -f "$work"/*.csv "$work"/*.run.json
methods() {  # methods BUDGET...: the two replayed caches, the window and the oracle at each budget
  for b in "$@"; do
    printf '%s\n' -e "h2o(heavy=$((b / 2)),window=$((b / 2)))" -e "tova(budget=$((b - 1)))" \
      -e "streaming(sink=4,window=$((b - 4)))" -e "topk(k=$b)"
  done
}
sweep() {  # sweep NAME DUMP N BUDGETS STEPS...: one sweep per prompt end P = N - 16 - steps (--prefill is one value)
  local name=$1 dump=$2 n=$3 budgets=$4
  shift 4
  local specs
  mapfile -t specs < <(methods $budgets)
  for steps in "$@"; do
    "$bin" sweep "$dump" --mask causal --queries last:16 --lengths "$n" --prefill $((n - 16 - steps)) "${specs[@]}" \
      --metrics spec_rel,selection --threads "$threads" -q --overwrite -o "$work/$name-steps$steps.csv"
  done
}
sweep charlm-causal data/charlm-causal.safetensors 4096 "128 512" 0 64 256 1024 3072 4080
if [ -f ../shared/data/stories260K.h5 ]; then
  sweep stories260K ../shared/data/stories260K.h5 512 "32 128" 0 16 64 192 496
fi
/usr/bin/python3 plots/eviction_steps.py reduce "$work"/*-steps*.csv -o plots/data/eviction-steps.csv
# Paired over heads at each number of steps: each cache against the window and the oracle, and TOVA against H2O.
rm -f "$compare"
for name in charlm-causal stories260K; do
  [ -f "$work/$name-steps0.csv" ] || continue
  budgets="128 512"
  [ "$name" = stories260K ] && budgets="32 128"
  for b in $budgets; do
    h2o="h2o(heavy=$((b / 2)),window=$((b / 2)))" tova="tova(budget=$((b - 1)))"
    stream="streaming(sink=4,window=$((b - 4)))" topk="topk(k=$b)"
    for pair in "$h2o|$stream" "$tova|$stream" "$tova|$h2o" "$h2o|$topk" "$tova|$topk"; do
      "$bin" summarize "$work/$name"-steps*.csv --compare "${pair%|*}" "${pair#*|}" --metrics spec_rel,mass_recall \
        > "$work/compare.tmp"
      if [ -f "$compare" ]; then tail -n +2 "$work/compare.tmp" >> "$compare"; else cp "$work/compare.tmp" "$compare"; fi
    done
  done
done
rm -f "$work/compare.tmp"
fi
/usr/bin/python3 plots/eviction_steps.py draw plots/data/eviction-steps.csv --compare "$compare" \
  -o "${FIGURES:-plots/figures}/eviction-steps.png"
