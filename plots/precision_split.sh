#!/usr/bin/env bash
# Rounding against approximation (docs/precision.md): the estimators of a full-mask sweep computed in f32, bf16 and
# f16 with the same draws, on our own model (data/charlm-hd64.h5) and stories260K (../shared/data, when present).
# Each sweep is reduced to plots/data/precision-split-NAME.csv.gz (fro_rel and the precision metrics) and the
# figure plots/figures/precision-split-NAME.png drawn from that file; the paired comparisons of the reading in
# plots/README.md come from the same files (sweep_csv.py restore, then attnprobe summarize --compare).
#
#   plots/precision_split.sh                  # about 15 seconds on 2 cores
#   plots/precision_split.sh --bundled-only   # rerun charlm-hd64 only, redraw stories260K from plots/data/
#   plots/precision_split.sh --from-data      # draw both from plots/data/ alone (FIGURES=DIR draws elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
data=plots/data
figures=${FIGURES:-plots/figures}
py=/usr/bin/python3
mode=${1:-sweep}
case $mode in
  sweep | --from-data | --bundled-only) ;;
  *) echo "precision_split.sh: unknown option '$mode' (use --from-data, --bundled-only or nothing)" >&2; exit 2 ;;
esac
mkdir -p "$figures"

split() {  # name dump length [slice selection...]
  local name=$1 dump=$2 n=$3
  shift 3
  local shared=0
  [ "${dump#../shared/data/}" != "$dump" ] && shared=1
  if [ "$mode" != --from-data ] && [ -f "$dump" ] && { [ "$mode" = sweep ] || [ "$shared" = 0 ]; }; then
    mkdir -p out/precision
    # --mask full: the estimators' full forms, as the seed papers measure them; --reference softmax for every one.
    "$bin" sweep "$dump" "$@" --mask full --lengths "$n" --trials 2 --seed 0 --reference softmax \
      --precision f32,bf16,f16 --metrics fro_rel,precision --overwrite -q -o "out/precision/$name.csv" \
      -e softmax -e vmean -e 'performer(M=64)' -e 'favorpp(M=64)' -e 'nystrom(L=32)' -e 'skeinformer(d=32)' \
      -e 'linformer(d=32)' -e 'yoso(m=32)' -e 'topk(k=32)'
    $py plots/sweep_csv.py reduce "out/precision/$name.csv" \
      --metrics fro_rel,approx_err,round_floor,round_excess,fa_ratio,nonfinite_rows -o "$data/precision-split-$name.csv.gz"
  fi
  $py plots/precision_split.py "$data/precision-split-$name.csv.gz" -o "$figures/precision-split-$name.png"
}

split charlm-hd64 data/charlm-hd64.h5 1024
split stories260K ../shared/data/stories260K.h5 512 --batch 0

# Where f16 breaks: a synthetic dump whose three layers have same-cluster logits of about 20, 50 and 100 (temperatures
# 0.05, 0.02, 0.01), Performer with and without its log-space shifts; the table of non-finite rows is printed from
# the committed plots/data/precision-split-synth-large.csv.gz.
if [ "$mode" != --from-data ]; then
  mkdir -p out/precision
  "$bin" synth -o out/precision/synth-large.h5 --layers 3 --heads 4 --batch 1 --tokens 512 --dim 16 \
    --temperatures 0.05,0.02,0.01 --seed 1 >/dev/null
  "$bin" sweep out/precision/synth-large.h5 -e softmax -e 'performer(M=64)' -e 'performer-raw(M=64)' --trials 2 \
    --seed 0 --precision f32,bf16,f16 --metrics fro_rel,precision --overwrite -q -o out/precision/synth-large.csv
  $py plots/sweep_csv.py reduce out/precision/synth-large.csv --metrics approx_err,round_excess,nonfinite_rows \
    -o "$data/precision-split-synth-large.csv.gz"
fi
$py plots/precision_split.py "$data/precision-split-synth-large.csv.gz" --nonfinite
