#!/usr/bin/env bash
# plots/reproduce_all.sh --from-data draws a figure from the data committed in plots/data/ alone: here the causal
# figure (a gzip-compressed reduced trial CSV read through plots/sweep_csv.py), into a temporary folder, and the
# PNG must be written and show a drawing (not one flat colour, and enough non-white pixels for axes and lines).
# Then the paired statistic the readings cite, from committed data alone: `sweep_csv.py restore` and
# `attnprobe summarize --compare` must give the kwt1 reading's sign count (hyper better on 12 of 12 heads).
# Skipped (77) without Debian's python3-matplotlib, which every figure script needs.
#   tests/test_plots_from_data.sh SOURCE_DIR ATTNPROBE
set -euo pipefail
src=${1:?usage: test_plots_from_data.sh SOURCE_DIR ATTNPROBE}
bin=${2:?usage: test_plots_from_data.sh SOURCE_DIR ATTNPROBE}
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 has no matplotlib (install python3-matplotlib, tools/install_deps.sh)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
FIGURES=$tmp "$src/plots/reproduce_all.sh" --from-data --only causal-charlm
png=$tmp/causal-charlm.png
[ -s "$png" ] || { echo "FAILED: $png was not written"; exit 1; }
/usr/bin/python3 - "$png" <<'PY'
import sys

import matplotlib.image as image

pixels = image.imread(sys.argv[1])[..., :3]
# The drawn figure is mostly white with axes, ticks, text and coloured lines: a blank or single-colour image has
# no spread and (almost) no non-white pixels.
non_white = float((pixels.min(axis=2) < 0.9).mean())
spread = float(pixels.std())
print(f"{sys.argv[1]}: {pixels.shape[1]}x{pixels.shape[0]}, non-white {non_white:.3f}, spread {spread:.3f}")
if pixels.shape[0] < 200 or pixels.shape[1] < 200 or non_white < 0.01 or spread < 0.02:
    sys.exit("FAILED: the figure is blank or too small")
PY
/usr/bin/python3 "$src/plots/sweep_csv.py" restore "$src/plots/data/beyond-kwt1.csv.gz" -o "$tmp/kwt1.csv"
"$bin" summarize "$tmp/kwt1.csv" --compare 'hyper(m=64,b=12)' 'performer(M=64)' --metrics spec_rel -o "$tmp/cmp.csv" \
  >/dev/null
/usr/bin/python3 - "$tmp/cmp.csv" <<'PY'
import csv
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
print(f"hyper(m=64) against performer(M=64) on kwt1: {rows}")
if len(rows) != 1 or (rows[0]["heads"], rows[0]["a_better"], rows[0]["b_better"]) != ("12", "12", "0"):
    sys.exit("FAILED: the restored data does not pair as plots/README.md reads it (12 of 12 heads)")
PY
echo "PASSED: plots/reproduce_all.sh --from-data drew causal-charlm.png; restored data pairs over heads"
