#!/usr/bin/env bash
# A selection's kept set below float32 (docs/precision.md, "Selection below float32"): eight selection methods (six
# that rank once a row or a prompt, two replayed caches) at a budget of 32-64 keys on the last 64 rows of
# stories260K's 512-token causal slices (all 40 heads, 4 batch items),
# computed in f32, bf16 and f16. The sweep is reduced to plots/data/selection-precision-stories260K.csv.gz
# (kept_overlap_f32, score_ties, cut_ties, fro_rel) and plots/figures/selection-precision-stories260K.png is drawn from
# that file; the paired table of the reading in plots/README.md is printed from it (--paired).
#
#   plots/selection_precision.sh              # the sweep (about 5 seconds on 2 cores; needs ../shared/data)
#   plots/selection_precision.sh --from-data  # draw from plots/data/ alone (FIGURES=DIR draws elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${ATTNPROBE:-build/attnprobe}
data=plots/data
figures=${FIGURES:-plots/figures}
py=/usr/bin/python3
mode=${1:-sweep}
case $mode in
  sweep | --from-data) ;;
  *) echo "selection_precision.sh: unknown option '$mode' (use --from-data or nothing)" >&2; exit 2 ;;
esac
mkdir -p "$figures"
dump=../shared/data/stories260K.h5
reduced=$data/selection-precision-stories260K.csv.gz
if [ "$mode" = sweep ] && [ -f "$dump" ]; then
  mkdir -p out/precision
  "$bin" sweep "$dump" -e 'topk(k=32)' -e 'quest(page=16,budget=64)' -e 'sparq(k=64,window=16)' \
    -e 'snapkv(budget=64,window=16)' -e 'tova(budget=64,heads=group,mode=prefill)' -e 'expected(budget=64)' \
    -e 'h2o(heavy=32,window=32)' -e 'tova(budget=64,heads=group)' \
    --mask causal --lengths 512 --queries last:64 --precision f32,bf16,f16 --seed 0 \
    --metrics fro_rel,kept_overlap_f32,score_ties,cut_ties --overwrite -q -o out/precision/selection.csv
  $py plots/sweep_csv.py reduce out/precision/selection.csv --metrics fro_rel,kept_overlap_f32,score_ties,cut_ties \
    -o "$reduced"
elif [ "$mode" = sweep ]; then
  echo "selection_precision.sh: $dump is absent; drawing the committed $reduced"
fi
$py plots/selection_precision.py "$reduced" -o "$figures/selection-precision-stories260K.png"
$py plots/selection_precision.py "$reduced" --paired
