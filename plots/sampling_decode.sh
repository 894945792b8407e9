#!/usr/bin/env bash
# Sampling against selection at decode, at equal keys read (docs/estimators/sampling_decode.md): the last 16 rows of
# our causal GQA model's 4096-token slices and of stories260K's 512-token ones (from ../shared/data, when present):
# the oracle top-k, StreamingLLM, and the three samplers — oracle sampling from the exact weights, MagicPIG (SimHash
# tables) and vAttention (top-k plus a pilot-sized uniform sample) — over their knobs, 4 trials for the random ones.
# Reduced to plots/data/sampling-density.csv and drawn as plots/figures/sampling-density.png; the paired table of
# plots/README.md ("Sampling at decode") comes from `attnprobe summarize --compare` on the sweeps.
#   ATTNPROBE=build/attnprobe plots/sampling_decode.sh
#   plots/sampling_decode.sh --from-data   # no sweeps: redraw the figure from the committed plots/data/
set -euo pipefail
cd "$(dirname "$0")/.."
. plots/from_data.sh
from_data_option sampling_decode.sh "$@"
if [ "$from_data" = 0 ]; then
bin=${ATTNPROBE:-build/attnprobe}
work=${WORK:-out/sampling}
mkdir -p "$work"
methods() {  # methods BUDGET...: topk, streaming and oracle sampling at each budget; MagicPIG and vAttention knobs
  for b in "$@"; do
    printf '%s\n' -e "topk(k=$b)" -e "streaming(sink=4,window=$((b - 4)))" -e "oracle_sample(b=$b)"
  done
  for l in 25 50 100 150 300; do printf '%s\n' -e "magicpig(L=$l)"; done
  for base in 0.01 0.03 0.1 0.3; do printf '%s\n' -e "vattention(base=$base)"; done
}
mapfile -t charlm < <(methods 64 128 256 512 1024)
"$bin" sweep data/charlm-causal.safetensors --mask causal --queries last:16 --lengths 4096 "${charlm[@]}" \
  --trials 4 --metrics spec_rel,selection -q --overwrite -o "$work/charlm-causal.csv"
inputs=("$work/charlm-causal.csv")
if [ -f ../shared/data/stories260K.h5 ]; then
  mapfile -t stories < <(methods 16 32 64 128)
  "$bin" sweep ../shared/data/stories260K.h5 --mask causal --queries last:16 --lengths 512 "${stories[@]}" \
    --trials 4 --metrics spec_rel,selection -q --overwrite -o "$work/stories260K.csv"
  inputs+=("$work/stories260K.csv")
fi
/usr/bin/python3 plots/sampling_density.py reduce "${inputs[@]}" -o plots/data/sampling-density.csv
fi
/usr/bin/python3 plots/sampling_density.py draw plots/data/sampling-density.csv -o "${FIGURES:-plots/figures}/sampling-density.png"
