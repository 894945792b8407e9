#!/usr/bin/env bash
# Error against samples, the seeds' estimators beside FAVOR++, HyperAttention, KDEformer and
# Scatterbrain, on our own model (data/charlm-hd64.h5) and the three dumps in ../shared/data (when
# present): sweeps into out/beyond/, figures into plots/figures/beyond-NAME.png. Block and window
# sizes follow n (b = w = n/8), as a method sized for n >= 4096 would be scaled down; with b >= n
# hyper and kdeformer would be exact. plots/README.md reads the figures. Each sweep is reduced to
# plots/data/beyond-NAME.csv.gz (spec_rel and mse) and the figure drawn from that committed file.
#
#   plots/beyond_compare.sh                  # about 3 minutes on 2 cores
#   plots/beyond_compare.sh --bundled-only   # rerun charlm-hd64 only, redraw the shared dumps from plots/data/
#   plots/beyond_compare.sh --from-data      # draw all four from plots/data/ alone (FIGURES=DIR draws elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
out=out/beyond
data=plots/data
figures=${FIGURES:-plots/figures}
py=/usr/bin/python3
mkdir -p "$figures"
mode=${1:-sweep}
case $mode in
  sweep | --from-data | --bundled-only) ;;
  *) echo "beyond_compare.sh: unknown option '$mode' (use --from-data, --bundled-only or nothing)" >&2; exit 2 ;;
esac

compare() {  # name dump length block [slice selection...]: sweep (unless --from-data), reduce, draw from the data
  local name=$1 dump=$2 n=$3 b=$4
  shift 4
  # Drawn from the committed data alone with --from-data, for a shared dump with --bundled-only, or when the dump
  # is not here (../shared/data absent).
  if [ "$mode" = --from-data ] || [ ! -f "$dump" ] || { [ "$mode" = --bundled-only ] && [ "${dump#../shared/data/}" != "$dump" ]; }; then
    $py plots/beyond_compare.py "$data/beyond-$name.csv.gz" -o "$figures/beyond-$name.png"
    return
  fi
  mkdir -p "$out"
  # --mask full: stories260K's and sasrec's dumps say causal = 1, which --mask auto would follow; these figures
  # measure bidirectional attention, as the seed papers do.
  "$bin" sweep "$dump" "$@" --mask full --lengths "$n" --samples 8..256:x2 --trials 4 --reference softmax \
    --metrics spec_rel,mse --overwrite -q -o "$out/$name.csv" \
    -e vmean -e performer -e lara -e nystrom -e skeinformer -e linformer -e yoso \
    -e favorpp -e 'favorpp(variant=sderf)' \
    -e "hyper(b=$b)" -e "hyper(b=$b,mask=0)" -e "kdeformer(b=$b)" -e "kdeformer(b=$b,probs=colnorm)" \
    -e "scatterbrain(w=$b)" -e "scatterbrain(w=$b,sparse=sortlsh)"
  $py plots/sweep_csv.py reduce "$out/$name.csv" --metrics spec_rel,mse -o "$data/beyond-$name.csv.gz"
  $py plots/beyond_compare.py "$data/beyond-$name.csv.gz" -o "$figures/beyond-$name.png"
}

compare charlm-hd64 data/charlm-hd64.h5 1024 128
shared=../shared/data
compare stories260K "$shared/stories260K.h5" 512 64 --batch 0
compare sasrec-ml1m "$shared/sasrec-ml1m.h5" 200 25
compare kwt1 "$shared/kwt1-speech.h5" 99 12 --batch 0..3
ls "$figures"/beyond-*.png
