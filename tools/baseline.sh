#!/usr/bin/env bash
# The project's regression gate on its own data: reruns a small fixed grid (every registered
# estimator, default settings plus the ablations) on the bundled dump and compares it with the
# committed baseline, data/baselines/synth-demo.csv. A change that makes any estimator's error
# worse beyond the statistical tolerance fails (attnprobe check exits 1).
#
#   tools/baseline.sh            # check (CTest runs this as the test "baseline_gate")
#   tools/baseline.sh --refresh  # rewrite the baseline after an intended change; commit it with the change
#
# ATTNPROBE (the binary, default build/attnprobe) and BASELINE_WORK (scratch folder, default
# build/baseline) may be set. All 8 slices of the dump at n = 64, 256, 1024, 8 trials: about 4 s on 2
# cores. Gated metrics: spec_rel, fro_rel, mse, angle, zero_rows (the absolute spec and fro are the
# relative ones times a constant of the fixed reference; nmse and maxabs add little and double the
# baseline file).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
work=${BASELINE_WORK:-build/baseline}
baseline=data/baselines/synth-demo.csv
estimators=(
  softmax vmean
  yoso-e yoso 'yoso(hash=hadamard)' 'yoso(norm=none)'
  skeinformer 'skeinformer(colsample=uniform)' 'skeinformer(rownorm=simple)' 'skeinformer(pilot_reuse=0)'
  'skeinformer(rownorm=exact,pilot_reuse=0)' informer linformer 'linformer(std=0.02)' linformer-jlt
  nystrom 'nystrom(pinv=exact)'
  performer 'performer(ortho=0)' ra 'ra(variant=biased)' 'ra(noise=raw)'
  lara 'lara(proposal=attn)' 'lara(proposal=mixed)' 'lara(proposal=mixture)' 'lara(weights=balance)'
  'lara(weights=coupled,beta=2)' 'lara(mode=mean)' 'lara(C=1)'
  favorpp 'favorpp(ortho=0)' 'favorpp(variant=arf)' 'favorpp(variant=arf,arf_ref=1)' 'favorpp(variant=sderf)'
  hyper 'hyper(mask=0)' 'hyper(order=code)' 'hyper(m=0)'
  kdeformer 'kdeformer(probs=uniform)' 'kdeformer(probs=colnorm)'
  scatterbrain 'scatterbrain(features=pos)' 'scatterbrain(features=oprf)' 'scatterbrain(sparse=block,ext=8)'
  'scatterbrain(sparse=sortlsh)' 'scatterbrain(sparse=smyrf)'
)
args=()
for e in "${estimators[@]}"; do args+=(-e "$e"); done
mkdir -p "$work"
"$bin" sweep data/synth-demo.h5 "${args[@]}" --lengths 64,256,1024 --trials 8 --seed 0 \
  --metrics spec_rel,fro_rel,mse,angle,zero_rows \
  --overwrite -q -o "$work/run.csv"
if [ "${1:-}" = "--refresh" ]; then
  mkdir -p "$(dirname "$baseline")"
  "$bin" summarize "$work/run.csv" -o "$baseline"
  echo "baseline: refreshed $baseline; commit it together with the change that moved it"
else
  "$bin" check "$work/run.csv" --baseline "$baseline" --improvements --json "$work/check.json"
fi
