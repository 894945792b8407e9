#!/usr/bin/python3
"""Attention-weight errors against the samples knob: row_tv (half the L1 distance between each row of
the implied attention matrix and the exact one), row_kl (KL of the exact row from the implied row, clamped
at 0 and renormalised) and topk_recall (share of each row's 8 largest exact weights among the implied
row's 8 largest), one panel each, one line per estimator setting (docs/metrics.md, "Attention-weight
metrics"). Lower is better for the first two, higher for recall. An estimator whose output error is
small while its row_tv is large gets the output right by cancellation, not by finding the keys.

Example:
  build/attnprobe sweep data/charlm-hd32.h5 -e performer -e 'yoso(norm=none)' -e hyper --samples 16..256:x4 \\
      --layers 0 --heads 0 --batch 0 --lengths 1024 --trials 4 --metrics spec_rel,weights -o out/w.csv
  /usr/bin/python3 plots/weight_metrics.py out/w.csv -o out/weights.png
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

PANELS = [("row_tv", "log"), ("row_kl", "log"), ("topk_recall", "linear")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", nargs="+", help="trial CSVs from attnprobe sweep with --metrics ...,weights")
    parser.add_argument("--n", default=None, help="only this length")
    parser.add_argument("--title", default=None)
    parser.add_argument("-o", "--output", required=True, help="image file (.png or .svg)")
    args = parser.parse_args()

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    found = False
    for ax, (metric, scale) in zip(axes, PANELS):
        filters = {"metric": metric, "trial": lambda t: t != "-1"}
        if args.n:
            filters["n"] = args.n
        rows = read_rows(args.sweep, **filters)
        if not rows:
            ax.axis("off")
            continue
        found = True
        draw_samples_lines(ax, rows)
        ax.set_xscale("log", base=2)
        ax.set_yscale(scale)
        ax.set_xlabel("samples knob")
        ax.set_ylabel(metric)
        ax.grid(True, which="both", alpha=0.3)
    if not found:
        sys.exit("weight_metrics: no row_tv/row_kl/topk_recall rows: sweep with --metrics ...,weights")
    style.room_above(axes[0], 0.4)
    style.legend(axes[0], loc="upper left", ncol=2, fontsize=6.5)
    fig.suptitle(args.title or "Attention-weight errors (mean ± s.e.; one slice: over trials)")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
