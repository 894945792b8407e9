#!/usr/bin/env bash
# The selection family at decode (docs/estimators/selection.md): the last 16 rows of our causal GQA model's
# 4096-token slices and of stories260K's 512-token ones (from ../shared/data, when present), each method — per-row
# selections, prompt compressions, replayed caches, and the kv-group shared forms — at five (four) key budgets, reduced to plots/data/selection-density.csv and drawn as plots/figures/selection-density.png
# with the paired table of plots/README.md ("Selection at decode"). Takes about a minute.
#   ATTNPROBE=build/attnprobe plots/selection_decode.sh
#   plots/selection_decode.sh --from-data   # no sweeps: redraw the figure from the committed plots/data/
set -euo pipefail
cd "$(dirname "$0")/.."
. plots/from_data.sh
from_data_option selection_decode.sh "$@"
if [ "$from_data" = 0 ]; then
bin=${ATTNPROBE:-build/attnprobe}
work=${WORK:-out/selection}
mkdir -p "$work"
methods() {  # methods BLOCK PAGE BUDGET...: every method at each budget, then topp at five masses
  local block=$1 page=$2
  shift 2
  for b in "$@"; do
    printf '%s\n' -e "topk(k=$b)" -e "streaming(sink=4,window=$((b - 4)))" -e "quest(page=$page,budget=$b)" \
      -e "quest(page=$page,budget=$b,last=1)" -e "moba(block=$block,topk=$((b / block)))" \
      -e "snapkv(window=16,budget=$b)" -e "expected(budget=$b)" -e "h2o(heavy=$((b / 2)),window=$((b / 2)))" \
      -e "tova(budget=$((b - 1)))" -e "topk(k=$b,share=group)" -e "snapkv(window=16,budget=$b,share=group)" \
      -e "tova(budget=$((b - 1)),heads=group)"
  done
  for p in 0.5 0.7 0.8 0.9 0.95; do printf '%s\n' -e "topp(p=$p)"; done
}
mapfile -t charlm < <(methods 64 16 64 128 256 512 1024)
"$bin" sweep data/charlm-causal.safetensors --mask causal --queries last:16 --lengths 4096 "${charlm[@]}" \
  --metrics spec_rel,selection -q --overwrite -o "$work/charlm-causal.csv"
inputs=("$work/charlm-causal.csv")
if [ -f ../shared/data/stories260K.h5 ]; then
  mapfile -t stories < <(methods 16 8 16 32 64 128)
  "$bin" sweep ../shared/data/stories260K.h5 --mask causal --queries last:16 --lengths 512 "${stories[@]}" \
    --metrics spec_rel,selection -q --overwrite -o "$work/stories260K.csv"
  inputs+=("$work/stories260K.csv")
fi
/usr/bin/python3 plots/selection_density.py reduce "${inputs[@]}" -o plots/data/selection-density.csv
fi
/usr/bin/python3 plots/selection_density.py draw plots/data/selection-density.csv -o "${FIGURES:-plots/figures}/selection-density.png" \
  --budget charlm-causal.safetensors=256 --budget stories260K.h5=64
