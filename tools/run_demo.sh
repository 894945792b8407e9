#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, sweeps the bundled dump with the
# registered estimators over lengths and trials, summarizes, and plots the error against length.
# Writes out/demo.csv, out/demo.run.json, out/demo-summary.csv and out/demo.png.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
dump=${1:-data/synth-demo.h5}
mkdir -p out
build/attnprobe info "$dump"
build/attnprobe sweep "$dump" -e softmax -e vmean --lengths 64..1024:x2 --trials 8 --overwrite -o out/demo.csv
build/attnprobe summarize out/demo.csv --over layer,head,batch -o out/demo-summary.csv
build/attnprobe summarize out/demo.csv --over layer,head,batch --table | grep -E "metric|spec_rel|angle"
/usr/bin/python3 plots/plot_sweep.py out/demo.csv --x n --metric spec_rel --metric angle --logy -o out/demo.png
echo "demo: wrote out/demo.csv, out/demo-summary.csv and out/demo.png"
