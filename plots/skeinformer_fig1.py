#!/usr/bin/python3
"""Skeinformer paper, Figure 1: spectral-norm error of the sketched attention against the sketch
size d, at the longest sequence lengths, one line per method, mean ± standard error.

The figure's axis says "percentage" while the text defines the absolute norm ||BV - R||_2, so both
are drawn: the top row is `spec`, the bottom row `spec_rel` (divided by ||BV||_2). Methods without
a samples knob (V-Mean) are flat lines. The paper's claim: Skeinformer lowest, especially at large
d; V-Mean flat. Input: a sweep with --samples over d, e.g.

  build/attnprobe sweep data/synth-demo.h5 -e vmean -e informer -e linformer -e nystrom -e skeinformer \\
      -e 'skeinformer(colsample=uniform)' -e 'skeinformer(rownorm=simple)' -e 'skeinformer(pilot_reuse=0)' \\
      --samples 8..256:x2 --lengths 512,1024 --trials 8 --metrics spec,spec_rel -o out/sketch.csv
  /usr/bin/python3 plots/skeinformer_fig1.py out/sketch.csv -o out/skeinformer-fig1.png
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style  # noqa: E402
from sweep_csv import draw_samples_lines, read_rows  # noqa: E402

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="trial CSVs of a sketching sweep")
    parser.add_argument("--lengths", default=None, help="comma-separated n to draw (default: the two longest)")
    parser.add_argument("-o", "--output", required=True, help="image file (.png, .svg)")
    args = parser.parse_args()

    rows = read_rows(args.csv, reference="softmax", metric=lambda m: m in ("spec", "spec_rel"))
    if not rows:
        sys.exit("skeinformer_fig1: no spec/spec_rel rows against softmax in the input")
    lengths = sorted({int(r["n"]) for r in rows if r["n"] != "all"})
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else lengths[-2:]

    fig, axes = plt.subplots(2, len(lengths), figsize=(5.5 * len(lengths), 8), squeeze=False)
    for col, n in enumerate(lengths):
        for row, metric in enumerate(("spec", "spec_rel")):
            ax = axes[row][col]
            subset = [r for r in rows if r["metric"] == metric and r["n"] == str(n)]
            draw_samples_lines(ax, subset)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("d (samples)")
            ax.set_ylabel("||BV - R||_2" if metric == "spec" else "||BV - R||_2 / ||BV||_2")
            ax.set_title(f"n = {n}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if row == 0 and col == 0:
                # Above the lines: below them Nyström's and Informer's exact limits fall to the bottom corners.
                style.room_above(ax, 0.4)
                style.legend(ax, loc="upper center", ncol=2)
    dumps = sorted({r["dump"] for r in rows})
    fig.suptitle(f"Skeinformer Fig. 1 on {', '.join(dumps)} (mean ± s.e. over slices)")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"skeinformer_fig1: wrote {args.output}")


if __name__ == "__main__":
    main()
