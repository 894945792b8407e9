#!/usr/bin/env bash
# plots/reproduce_all.sh --from-data draws a figure from the data committed in plots/data/ alone: here the causal
# figure (a gzip-compressed reduced trial CSV read through plots/sweep_csv.py), into a temporary folder, and the
# PNG must be written and show a drawing (not one flat colour, and enough non-white pixels for axes and lines).
# Skipped (77) without Debian's python3-matplotlib, which every figure script needs.
#   tests/test_plots_from_data.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: test_plots_from_data.sh SOURCE_DIR}
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
echo "PASSED: plots/reproduce_all.sh --from-data drew causal-charlm.png"
