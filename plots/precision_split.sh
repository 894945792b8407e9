#!/usr/bin/env bash
# Rounding against approximation (docs/precision.md): the estimators of a full-mask sweep computed in f32, bf16 and
# f16 with the same draws, on our own model (data/charlm-hd64.h5) and stories260K (../shared/data, when present).
# Three groups of estimators per dump: the seed papers' (with topk) and the rest of the estimators with a full form,
# on whole slices under the full mask; and the inference-time methods (selection, eviction, sampling) on decode steps,
# the last 64 rows of causal slices against their caches. Each sweep is reduced to
# plots/data/precision-split[-rest|-decode]-NAME.csv.gz (fro_rel and the precision metrics) and the figure
# plots/figures/precision-split[-rest|-decode]-NAME.png drawn from that file; the paired comparisons of the reading in
# plots/README.md come from the same files (sweep_csv.py restore, then attnprobe summarize --compare).
#
#   plots/precision_split.sh                  # about 35 seconds on 2 cores
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

# The groups; softmax in each, for the floor the figure draws. The decode group's budgets are 32-64 keys of 512.
seed_group=(-e softmax -e vmean -e 'performer(M=64)' -e 'favorpp(M=64)' -e 'nystrom(L=32)' -e 'skeinformer(d=32)'
  -e 'linformer(d=32)' -e 'yoso(m=32)' -e 'topk(k=32)')
rest_group=(-e softmax -e 'yoso-e(tau=8)' -e 'linformer-jlt(d=32)' -e informer -e 'ra(S=4)' -e 'lara(C=32)'
  -e 'hyper(b=64,m=32)' -e 'kdeformer(b=64,m=32)' -e 'scatterbrain(M=32,w=32)')
decode_group=(-e softmax -e 'topk(k=32)' -e 'topp(p=0.9)' -e 'quest(page=16,budget=64)' -e 'moba(block=16,topk=4)'
  -e 'sparq(k=64,window=16)' -e 'snapkv(budget=64,window=16)' -e 'expected(budget=64)' -e 'streaming(sink=4,window=60)'
  -e 'h2o(heavy=32,window=32)' -e 'tova(budget=64,heads=group)' -e 'oracle_sample(b=64)' -e magicpig -e vattention
  -e 'uniform_keys(b=64)')

split() {  # group name dump length [slice selection...]
  local group=$1 name=$2 dump=$3 n=$4
  shift 4
  local estimators geometry file
  case $group in
    seed) estimators=("${seed_group[@]}") geometry=(--mask full) file=precision-split-$name ;;
    rest) estimators=("${rest_group[@]}") geometry=(--mask full) file=precision-split-rest-$name ;;
    decode)
      estimators=("${decode_group[@]}") geometry=(--mask causal --queries last:64) file=precision-split-decode-$name
      ;;
  esac
  local shared=0
  [ "${dump#../shared/data/}" != "$dump" ] && shared=1
  if [ "$mode" != --from-data ] && [ -f "$dump" ] && { [ "$mode" = sweep ] || [ "$shared" = 0 ]; }; then
    mkdir -p out/precision
    # The seed and rest groups under the full mask, their full forms as the seed papers measure them; --reference softmax
    # for every one.
    "$bin" sweep "$dump" "$@" "${geometry[@]}" --lengths "$n" --trials 2 --seed 0 --reference softmax \
      --precision f32,bf16,f16 --metrics fro_rel,precision --overwrite -q -o "out/precision/$file.csv" \
      "${estimators[@]}"
    $py plots/sweep_csv.py reduce "out/precision/$file.csv" \
      --metrics fro_rel,approx_err,round_floor,round_excess,fa_ratio,nonfinite_rows -o "$data/$file.csv.gz"
  fi
  $py plots/precision_split.py "$data/$file.csv.gz" -o "$figures/$file.png"
}

for group in seed rest decode; do
  split $group charlm-hd64 data/charlm-hd64.h5 1024
  split $group stories260K ../shared/data/stories260K.h5 512 --batch 0
done

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
