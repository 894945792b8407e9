#!/usr/bin/env bash
# Reruns the sweeps behind the three paper figures on the bundled dumps and draws them as PNG and
# SVG into out/figures/ (YOSO Fig. 8, Skeinformer Fig. 1, LARA Fig. 1), then issue 18's analysis
# figures on charlm-hd32 (plots/analysis_charlm.sh, into plots/figures/analysis-*.png). plots/README.md explains
# each figure, what the paper claimed and what the data shows.
#
#   plots/reproduce_all.sh            # the bundled dumps (synth-demo, charlm-hd64), a few minutes on 2 cores
#   plots/reproduce_all.sh --shared   # also ../shared/data/stories260K.h5 and kwt1-speech.h5, when present
#
# Needs a build (tools/build.sh) and Debian's python3-matplotlib (tools/install_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
out=out/figures
py=/usr/bin/python3
mkdir -p "$out"

figures() {  # name dump yoso-lengths sketch-lengths sketch-samples lara-lengths lara-samples
  local name=$1 dump=$2 yoso_lengths=$3 sketch_lengths=$4 sketch_samples=$5 lara_lengths=$6 lara_samples=$7
  echo "== $name: YOSO Fig. 8"
  "$bin" sweep "$dump" -e yoso --samples 8..128:x2 ${yoso_lengths:+--lengths $yoso_lengths} --trials 8 \
    --metrics angle,zero_rows --overwrite -q -o "$out/yoso-$name.csv"
  echo "== $name: Skeinformer Fig. 1"
  "$bin" sweep "$dump" -e vmean -e informer -e linformer -e nystrom -e skeinformer -e 'skeinformer(colsample=uniform)' \
    -e 'skeinformer(rownorm=simple)' -e 'skeinformer(pilot_reuse=0)' --samples "$sketch_samples" \
    ${sketch_lengths:+--lengths $sketch_lengths} --trials 8 --metrics spec,spec_rel --overwrite -q -o "$out/sketch-$name.csv"
  echo "== $name: LARA Fig. 1"
  "$bin" sweep "$dump" -e performer -e lara --samples "$lara_samples" ${lara_lengths:+--lengths $lara_lengths} \
    --trials 8 --metrics mse --overwrite -q -o "$out/lara-$name.csv"
  "$bin" sweep "$dump" -e ra -e vmean --samples 1,2,4 ${lara_lengths:+--lengths $lara_lengths} --trials 8 \
    --metrics mse --overwrite -q -o "$out/lara-ra-$name.csv"
  for ext in png svg; do
    $py plots/yoso_fig8.py "$out/yoso-$name.csv" -o "$out/yoso-fig8-$name.$ext"
    $py plots/skeinformer_fig1.py "$out/sketch-$name.csv" -o "$out/skeinformer-fig1-$name.$ext"
    $py plots/lara_fig1.py "$out/lara-$name.csv" "$out/lara-ra-$name.csv" -o "$out/lara-fig1-$name.$ext"
  done
}

figures synth-demo data/synth-demo.h5 64..1024:x2 512,1024 8..256:x2 256,512,1024 8..1024:x2
# Our own trained model at the papers' lengths (YOSO: up to 4096; Skeinformer: 1024 and 4096).
figures charlm-hd64 data/charlm-hd64.h5 64..4096:x2 1024,4096 8..256:x2 256,1024,4096 8..1024:x2
if [ "${1:-}" = "--shared" ]; then
  shared=../shared/data
  if [ -f "$shared/stories260K.h5" ]; then
    figures stories260K "$shared/stories260K.h5" 64..512:x2 256,512 8..256:x2 128,256,512 8..512:x2
  fi
  if [ -f "$shared/kwt1-speech.h5" ]; then
    figures kwt1 "$shared/kwt1-speech.h5" "" "" 8..64:x2 "" 4..64:x2
  fi
fi
# Issue 18's figure set on our own model (bias/variance, weight errors, Pareto at n = 1024 and 4096,
# diagnostics vs error): plots/figures/analysis-*.png, about 2 minutes more.
plots/analysis_charlm.sh
echo "reproduce_all: figures in $out/ and plots/figures/analysis-*.png"
ls "$out"/*.png
