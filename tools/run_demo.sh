#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, and measures the estimators on the bundled
# dump of the project's own trained character model (data/charlm-hd32.h5: 2 layers x 2 heads x 2
# held-out sequences of 4096 tokens) over lengths 64..4096, then summarizes and plots error against
# length; then the same for causal attention on our causal decoder (out/demo-causal.*). Writes
# out/demo.csv, out/demo.csv.run.json, out/demo-summary.csv, out/demo.png, out/report.html (the page to read first),
# out/demo-causal.csv, out/demo-causal.png, out/report-causal.html.
# Another dump: tools/run_demo.sh path/to/dump.h5 (its full length should be >= 4096, or edit --lengths).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh --for demo  # only what the demo uses: tools/run_tests.sh installs the rest
tools/build.sh --target attnprobe  # the CLI alone: the tests and the Python module are run_tests.sh's
dump=${1:-data/charlm-hd32.h5}
mkdir -p out
build/attnprobe info "$dump" --entropy
build/attnprobe sweep "$dump" -e softmax -e vmean -e nystrom -e skeinformer -e performer -e lara -e yoso \
  --lengths 64..4096:x2 --trials 4 --metrics all,case --overwrite -o out/demo.csv
build/attnprobe summarize out/demo.csv --over layer,head,batch -o out/demo-summary.csv
build/attnprobe summarize out/demo.csv --over layer,head,batch --table | grep -E "metric|spec_rel"
/usr/bin/python3 plots/plot_sweep.py out/demo.csv --x n --metric spec_rel --metric angle --logy -o out/demo.png
# The page to read it all in a browser: the per-head maps with each head's entropy and support beside them.
build/attnprobe diagnose "$dump" --lengths 4096 -q -o out/demo-diagnose.csv
build/attnprobe report out/demo.csv --diagnostics out/demo-diagnose.csv -o out/report.html
# The causal case: our causal grouped-query model (data/charlm-causal.safetensors, bf16, 4 query heads
# reading 2 kv heads; its causal=1 attribute makes --mask auto measure it causally), every estimator
# that has a causal form (`attnprobe list`), lengths 64..4096.
build/attnprobe info data/charlm-causal.safetensors
causal=()
for name in $(build/attnprobe list --causal); do causal+=(-e "$name"); done
build/attnprobe sweep data/charlm-causal.safetensors "${causal[@]}" --lengths 64..4096:x2 --trials 4 --overwrite \
  -o out/demo-causal.csv
build/attnprobe summarize out/demo-causal.csv --over layer,head,batch --table | grep -E "metric|spec_rel"
/usr/bin/python3 plots/plot_sweep.py out/demo-causal.csv --x n --metric spec_rel --metric angle --logy \
  --title "causal attention, charlm-causal (bf16 safetensors, GQA 4/2)" -o out/demo-causal.png
build/attnprobe report out/demo-causal.csv -o out/report-causal.html
echo "demo: wrote out/demo.csv, out/demo-summary.csv, out/demo.png, out/demo-causal.csv and out/demo-causal.png"
echo "demo: open out/report.html (and out/report-causal.html) in a browser"
