#!/usr/bin/python3
"""Plot an attnprobe sweep: one panel per metric, error against sequence length (--x n) or
against the samples knob (--x samples), one line per estimator setting, mean ± standard error.

Reads only the long trial CSV (docs/csv.md). Per slice (layer, head, batch item) the
trials are averaged first; the line is the mean over slices and the error bar its standard error,
so slices are the replicates (with one slice, the trials are).

Example:
  /usr/bin/python3 plots/plot_sweep.py out/demo.csv --x n --metric spec_rel --metric angle -o out/demo.png
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style  # noqa: E402
from sweep_csv import aggregate, integer, is_floor, line_label, read_rows  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="trial CSVs from attnprobe sweep")
    parser.add_argument("--x", choices=["n", "samples"], default="n", help="horizontal axis")
    parser.add_argument("--metric", action="append", help="metric to plot (repeatable; default spec_rel)")
    parser.add_argument("--logy", action="store_true", help="logarithmic error axis")
    parser.add_argument("--floor", action="store_true",
                        help="also draw exact attention's float32 floor (softmax against its float64 reference)")
    parser.add_argument("--title", default=None)
    parser.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
    args = parser.parse_args()
    metrics = args.metric or ["spec_rel"]

    rows = [r for r in read_rows(args.csv, metric=lambda m: m in metrics) if args.floor or not is_floor(r)]
    if not rows:
        sys.exit("plot_sweep: no rows for " + ", ".join(metrics))

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        lines = aggregate([r for r in rows if r["metric"] == metric], lambda r: line_label(r, args.x == "n"),
                          lambda r: integer(r[args.x]))
        styles = style.settings_styles(sorted(lines))
        for label, points in sorted(lines.items()):
            xs, ys, ses = zip(*points)
            ax.errorbar(xs, ys, yerr=ses, color=style.colour(label), label=label, **styles[label])
        ax.set_xscale("log", base=2)
        if args.logy:
            ax.set_yscale("log")
        ax.set_xlabel("sequence length n" if args.x == "n" else "samples")
        ax.set_ylabel(f"{metric} vs softmax (or as labelled)")
        ax.grid(True, which="both", alpha=0.3)
    style.legend(axes[0][0])
    dumps = sorted({r["dump"] for r in rows})
    fig.suptitle(args.title or f"attnprobe: {', '.join(dumps)} (mean ± s.e. over slices)")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot_sweep: wrote {args.output}")


if __name__ == "__main__":
    main()
