#!/usr/bin/env bash
# vAttention's (eps, delta) promise measured (issue 41): vattention(eps, delta) sizes its uniform sample so that
# |o_hat - o| <= eps |o| should hold with probability at least 1 - delta; eps_cover is the fraction of rows (and
# trials) where it does. The last 16 rows of our causal GQA model's 4096-token slices and of stories260K's 512-token
# ones (from ../shared/data, when present), 8 trials: (eps, delta) over a grid with the default draw=hh and pilot
# fraction base = 0.05, and at two pairs the pilot fraction (base 0.01, 0.2) and the weighting (draw=ref, the
# reference code's; draw=wor, the paper's) varied. One sweep per eps, with --eps set to it (vattention's eps_cover
# uses its own eps; --eps sets the same for any other metric reader). Reduced to plots/data/vattention-cover.csv and
# drawn as plots/figures/vattention-cover.png; the paired comparisons of plots/README.md ("vAttention's promise")
# are `attnprobe summarize --compare` on these sweeps, kept in plots/data/vattention-cover-compare.csv.
# About 3.5 minutes on two shared cores.
#   ATTNPROBE=build/attnprobe plots/vattention_cover.sh
#   plots/vattention_cover.sh --from-data   # no sweeps: redraw the figure from the committed plots/data/
set -euo pipefail
cd "$(dirname "$0")/.."
. plots/from_data.sh
from_data_option vattention_cover.sh "$@"
compare=plots/data/vattention-cover-compare.csv
if [ "$from_data" = 0 ]; then
bin=${ATTNPROBE:-build/attnprobe}
work=${WORK:-out/vattention}
threads=${THREADS:-1}
mkdir -p "$work"
rm -f "$work"/*.csv "$work"/*.run.json
deltas="0.05 0.1 0.25 0.4"
variants="0.1:0.1 0.25:0.25"  # eps:delta pairs where the pilot and the weighting vary
specs_for() {  # specs_for EPS: the grid's pairs at this eps, and the variants of the pairs at this eps
  local eps=$1
  for d in $deltas; do printf '%s\n' -e "vattention(eps=$eps,delta=$d)"; done
  for pair in $variants; do
    [ "${pair%:*}" = "$eps" ] || continue
    local d=${pair#*:}
    printf '%s\n' -e "vattention(eps=$eps,delta=$d,base=0.01)" -e "vattention(eps=$eps,delta=$d,base=0.2)" \
      -e "vattention(eps=$eps,delta=$d,draw=ref)" -e "vattention(eps=$eps,delta=$d,draw=wor)"
  done
}
sweep() {  # sweep NAME DUMP N: one sweep per eps
  local name=$1 dump=$2 n=$3 specs
  for eps in 0.05 0.1 0.25; do
    mapfile -t specs < <(specs_for $eps)
    "$bin" sweep "$dump" --mask causal --queries last:16 --lengths "$n" "${specs[@]}" --trials 8 --eps "$eps" \
      --metrics spec_rel,selection --threads "$threads" -q --overwrite -o "$work/$name-eps$eps.csv"
  done
}
sweep charlm-causal data/charlm-causal.safetensors 4096
names=(charlm-causal)
if [ -f ../shared/data/stories260K.h5 ]; then
  sweep stories260K ../shared/data/stories260K.h5 512
  names+=(stories260K)
fi
/usr/bin/python3 plots/vattention_cover.py reduce "$work"/*-eps*.csv -o plots/data/vattention-cover.csv
# Paired over heads: each variant against its pair's default (draw=hh, base=0.05), and a smaller delta against a
# larger one at each eps.
rm -f "$compare"
for name in "${names[@]}"; do
  pairs=()
  for pair in $variants; do
    eps=${pair%:*} d=${pair#*:}
    base="vattention(eps=$eps,delta=$d)"
    for v in base=0.01 base=0.2 draw=ref draw=wor; do pairs+=("vattention(eps=$eps,delta=$d,$v)|$base"); done
  done
  for eps in 0.05 0.1 0.25; do pairs+=("vattention(eps=$eps,delta=0.05)|vattention(eps=$eps,delta=0.4)"); done
  for pair in "${pairs[@]}"; do
    "$bin" summarize "$work/$name"-eps*.csv --compare "${pair%|*}" "${pair#*|}" \
      --metrics eps_cover,spec_rel,density,den_rel > "$work/compare.tmp"
    if [ -f "$compare" ]; then tail -n +2 "$work/compare.tmp" >> "$compare"; else cp "$work/compare.tmp" "$compare"; fi
  done
done
rm -f "$work/compare.tmp"
fi
/usr/bin/python3 plots/vattention_cover.py draw plots/data/vattention-cover.csv --compare "$compare" \
  -o "${FIGURES:-plots/figures}/vattention-cover.png"
