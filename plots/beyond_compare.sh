#!/usr/bin/env bash
# Error against samples, the seeds' estimators beside FAVOR++, HyperAttention, KDEformer and
# Scatterbrain, on our own model (data/charlm-hd64.h5) and the three dumps in ../shared/data (when
# present): sweeps into out/beyond/, figures into plots/figures/beyond-NAME.png. Block and window
# sizes follow n (b = w = n/8), as a method sized for n >= 4096 would be scaled down; with b >= n
# hyper and kdeformer would be exact. plots/README-beyond.md reads the figures.
#
#   plots/beyond_compare.sh      # about 3 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
out=out/beyond
py=/usr/bin/python3
mkdir -p "$out" plots/figures

compare() {  # name dump length block [slice selection...]
  local name=$1 dump=$2 n=$3 b=$4
  shift 4
  "$bin" sweep "$dump" "$@" --lengths "$n" --samples 8..256:x2 --trials 4 --reference softmax \
    --metrics spec_rel,mse --overwrite -q -o "$out/$name.csv" \
    -e vmean -e performer -e lara -e nystrom -e skeinformer -e linformer -e yoso \
    -e favorpp -e 'favorpp(variant=sderf)' \
    -e "hyper(b=$b)" -e "hyper(b=$b,mask=0)" -e "kdeformer(b=$b)" -e "kdeformer(b=$b,probs=colnorm)" \
    -e "scatterbrain(w=$b)" -e "scatterbrain(w=$b,sparse=sortlsh)"
  $py plots/beyond_compare.py "$out/$name.csv" -o "plots/figures/beyond-$name.png"
}

compare charlm-hd64 data/charlm-hd64.h5 1024 128
shared=../shared/data
if [ -f "$shared/stories260K.h5" ]; then compare stories260K "$shared/stories260K.h5" 512 64 --batch 0; fi
if [ -f "$shared/sasrec-ml1m.h5" ]; then compare sasrec-ml1m "$shared/sasrec-ml1m.h5" 200 25; fi
if [ -f "$shared/kwt1-speech.h5" ]; then compare kwt1 "$shared/kwt1-speech.h5" 99 12 --batch 0..3; fi
ls plots/figures/beyond-*.png
