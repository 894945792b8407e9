#!/usr/bin/env bash
# Issue 18's figure set on our own model (data/charlm-hd32.h5, head dim 32): the bias/variance split,
# the attention-weight errors, error per unit of cost (Pareto) at n = 1024 and 4096, and head diagnostics
# against error. Sweeps into out/analysis/, figures into plots/figures/analysis-*.png; plots/README.md
# ("Issue 18: bias, variance, weights, cost, hard heads") reads them. Small on purpose (one slice for the
# per-estimator figures, few trials): 25 seconds on 2 cores (load average 0.8), 2 minutes at load average 12.
# The sweeps are reduced to the metrics the figures draw in plots/data/analysis-*.csv.gz (bench and diagnose CSVs
# copied as they are), and the figures are drawn from that committed data only.
#
#   plots/analysis_charlm.sh               # rerun the sweeps, rewrite plots/data/analysis-*, draw
#   plots/analysis_charlm.sh --from-data   # draw from plots/data/ alone (FIGURES=DIR draws elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
dump=data/charlm-hd32.h5
out=out/analysis
data=plots/data
figures=${FIGURES:-plots/figures}
py=/usr/bin/python3
mkdir -p "$figures"
draw_only=0
case ${1:-} in
  --from-data) draw_only=1 ;;
  "") ;;
  *) echo "analysis_charlm.sh: unknown option '$1' (use --from-data or nothing)" >&2; exit 2 ;;
esac
if [ "$draw_only" = 0 ]; then
mkdir -p "$out"

# Random estimators at n = 1024 on one slice (layer 1, head 0, item 0), 8 trials, the samples knob
# 8..256: errors, the case rows (bias/variance) and the weight metrics, all against softmax (yoso too, not its
# YOSO-E target: the question is the distance from exact attention). b = w = 128 = n/8 (beyond_compare.sh).
main_estimators=(-e performer -e favorpp -e 'favorpp(variant=sderf)' -e lara -e yoso -e 'yoso(hash=hadamard)'
  -e 'hyper(b=128)' -e 'kdeformer(b=128)' -e 'scatterbrain(w=128)' -e linformer -e linformer-jlt -e skeinformer
  -e informer)
"$bin" sweep "$dump" "${main_estimators[@]}" --layers 1 --heads 0 --batch 0 --lengths 1024 --samples 8..256:x2 \
  --trials 8 --reference softmax --metrics spec_rel,nmse,case,weights --overwrite -q -o "$out/main-1024.csv"
# RA costs O(S·n²·p): its own knob range (S per query).
"$bin" sweep "$dump" -e ra -e 'ra(noise=raw)' --layers 1 --heads 0 --batch 0 --lengths 1024 --samples 1..16:x2 \
  --trials 8 --metrics spec_rel,nmse,case,weights --overwrite -q -o "$out/ra-1024.csv"
# Deterministic lines for the weight and Pareto figures (one trial each).
"$bin" sweep "$dump" -e vmean -e nystrom -e yoso-e --layers 1 --heads 0 --batch 0 --lengths 1024 \
  --samples 8..256:x2 --trials 1 --metrics spec_rel,nmse,weights --overwrite -q -o "$out/det-1024.csv"
"$bin" summarize "$out/main-1024.csv" "$out/ra-1024.csv" --slopes --table >"$out/slopes-1024.txt"

# Pareto at n = 4096: errors (2 trials) and bench times at the same specs, p = 32, one thread.
pareto_estimators=(-e performer -e favorpp -e lara -e yoso -e 'hyper(b=512)' -e 'kdeformer(b=512)'
  -e 'scatterbrain(w=512)' -e linformer -e skeinformer -e nystrom)
"$bin" sweep "$dump" "${pareto_estimators[@]}" -e vmean --layers 1 --heads 0 --batch 0 --lengths 4096 \
  --samples 16..256:x4 --trials 2 --reference softmax --metrics spec_rel --overwrite -q -o "$out/pareto-4096.csv"
# The times under bench's protocol (bench/rounds.py): the whole list in 3 alternating rounds, each point's lowest median.
ATTNPROBE=$bin $py bench/rounds.py --rounds 3 --csv "$out/bench-1024.csv" -- "${main_estimators[@]}" -e nystrom \
  -e vmean -e yoso-e -e softmax --samples 8..256:x2 --lengths 1024 --p 32 --threads 1 --repeat 3 --no-sgemm
ATTNPROBE=$bin $py bench/rounds.py --rounds 3 --csv "$out/bench-4096.csv" -- "${pareto_estimators[@]}" -e vmean \
  -e softmax --samples 16..256:x4 --lengths 4096 --p 32 --threads 1 --repeat 3 --no-sgemm

# Why a head is hard: every slice (2 layers × 2 heads × 2 items) at n = 1024, three estimators.
"$bin" diagnose "$dump" --lengths 1024 -o "$out/diagnose-1024.csv"
"$bin" sweep "$dump" -e 'performer(M=64)' -e 'yoso(m=32)' -e 'scatterbrain(w=128)' -e 'hyper(b=128)' --lengths 1024 \
  --trials 2 --reference softmax --metrics spec_rel --overwrite -q -o "$out/heads-1024.csv"

cat "$out/slopes-1024.txt"
# The committed data, one set of files per figure (plots/data/FIGURE*.csv[.gz]): the metrics each draws
# (bias/variance: bias_fro_rel, var_fro_rel; weights: row_tv, row_kl, topk_recall; Pareto and diagnostics: spec_rel),
# RA apart (it has no bench time, so the Pareto figure does not read it), the bench timings and head diagnostics as
# they are.
reduce() { $py plots/sweep_csv.py reduce "$@"; }
reduce "$out/main-1024.csv" "$out/det-1024.csv" --metrics bias_fro_rel,var_fro_rel -o "$data/analysis-bias-variance.csv.gz"
reduce "$out/ra-1024.csv" --metrics bias_fro_rel,var_fro_rel -o "$data/analysis-bias-variance-ra.csv.gz"
reduce "$out/main-1024.csv" "$out/det-1024.csv" --metrics row_tv,row_kl,topk_recall -o "$data/analysis-weights.csv.gz"
reduce "$out/ra-1024.csv" --metrics row_tv,row_kl,topk_recall -o "$data/analysis-weights-ra.csv.gz"
reduce "$out/main-1024.csv" "$out/det-1024.csv" --metrics spec_rel -o "$data/analysis-pareto-1024.csv.gz"
reduce "$out/pareto-4096.csv" --metrics spec_rel -o "$data/analysis-pareto-4096.csv.gz"
reduce "$out/heads-1024.csv" --metrics spec_rel -o "$data/analysis-diagnostics-heads.csv.gz"
cp "$out/bench-1024.csv" "$data/analysis-pareto-1024-bench.csv"
cp "$out/bench-4096.csv" "$data/analysis-pareto-4096-bench.csv"
cp "$out/diagnose-1024.csv" "$data/analysis-diagnostics.csv"
fi

$py plots/bias_variance.py "$data/analysis-bias-variance.csv.gz" "$data/analysis-bias-variance-ra.csv.gz" \
  --title "charlm-hd32, n = 1024, layer 1 head 0: bias² vs variance of one trial (8 trials)" \
  -o "$figures"/analysis-bias-variance.png
$py plots/weight_metrics.py "$data/analysis-weights.csv.gz" "$data/analysis-weights-ra.csv.gz" \
  --title "charlm-hd32, n = 1024, layer 1 head 0: attention-weight errors" -o "$figures"/analysis-weights.png
$py plots/pareto.py "$data/analysis-pareto-1024.csv.gz" "$data/analysis-pareto-1024-bench.csv" --n 1024 \
  --title "charlm-hd32, n = 1024: spec_rel against ms per call (1 thread, lowest of 3 rounds)" \
  -o "$figures"/analysis-pareto-1024.png
$py plots/pareto.py "$data/analysis-pareto-4096.csv.gz" "$data/analysis-pareto-4096-bench.csv" --n 4096 \
  --title "charlm-hd32, n = 4096: spec_rel against ms per call (1 thread, lowest of 3 rounds)" \
  -o "$figures"/analysis-pareto-4096.png
$py plots/diagnostics_vs_error.py "$data/analysis-diagnostics.csv" "$data/analysis-diagnostics-heads.csv.gz" \
  -o "$figures"/analysis-diagnostics.png
ls "$figures"/analysis-*.png
