#!/usr/bin/env bash
# YOSO against its decode-time heir MagicPIG at equal keys read (issue 41; docs/estimators/sampling_decode.md): the
# last 16 rows of our causal GQA model's 4096-token slices and of stories260K's 512-token ones (from ../shared/data,
# when present). YOSO (m = 8..512 hashes of 8 bits) is measured twice, against softmax and against its own target
# yoso-e, and yoso-e against softmax; MagicPIG (K = 10, L = 5..300 tables) against softmax; 4 trials each.
# MagicPIG's keys read are its measured keys_attended; YOSO's are the keys its estimate sums, those colliding with
# the query in at least one hash, taken in expectation from the dump (yoso_magicpig.py reduce needs the Python
# package). Reduced to plots/data/yoso-magicpig.csv and drawn as plots/figures/yoso-magicpig.png with the paired
# table of plots/README.md ("YOSO against MagicPIG"). About 30 s on two shared cores.
#   ATTNPROBE=build/attnprobe PYTHONPATH=build/python plots/yoso_magicpig.sh   # (those two are the defaults)
#   plots/yoso_magicpig.sh --from-data   # no sweeps: redraw the figure from the committed plots/data/
set -euo pipefail
cd "$(dirname "$0")/.."
. plots/from_data.sh
from_data_option yoso_magicpig.sh "$@"
if [ "$from_data" = 0 ]; then
  bin=${ATTNPROBE:-build/attnprobe}
  export PYTHONPATH=${PYTHONPATH:-build/python}  # the reduce step reads the dumps through the Python package
  work=${WORK:-out/yoso-magicpig}
  mkdir -p "$work"
  yoso=()
  for m in 8 16 32 64 128 256 512; do yoso+=(-e "yoso(m=$m)"); done
  magicpig=()
  for l in 5 10 25 50 100 150 300; do magicpig+=(-e "magicpig(L=$l)"); done
  inputs=() dumps=()
  sweeps() {  # sweeps NAME DUMP N
    local name=$1 dump=$2 n=$3
    local common=(--mask causal --queries last:16 --lengths "$n" --trials 4 -q --overwrite)
    "$bin" sweep "$dump" "${yoso[@]}" -e yoso-e --reference softmax --metrics spec_rel,angle "${common[@]}" \
      -o "$work/$name-yoso-softmax.csv"
    "$bin" sweep "$dump" "${yoso[@]}" --metrics spec_rel,angle "${common[@]}" -o "$work/$name-yoso-own.csv"
    "$bin" sweep "$dump" "${magicpig[@]}" --metrics spec_rel,angle,density "${common[@]}" -o "$work/$name-magicpig.csv"
    inputs+=("$work/$name-yoso-softmax.csv" "$work/$name-yoso-own.csv" "$work/$name-magicpig.csv")
    dumps+=(--dump "$dump")
  }
  sweeps charlm-causal data/charlm-causal.safetensors 4096
  if [ -f ../shared/data/stories260K.h5 ]; then
    sweeps stories260K ../shared/data/stories260K.h5 512
  fi
  /usr/bin/python3 plots/yoso_magicpig.py reduce "${inputs[@]}" "${dumps[@]}" -o plots/data/yoso-magicpig.csv
fi
/usr/bin/python3 plots/yoso_magicpig.py draw plots/data/yoso-magicpig.csv -o "${FIGURES:-plots/figures}/yoso-magicpig.png"
