#!/usr/bin/python3
"""Bias against variance: for each random estimator and sample count, the case rows (trial -1) of a
sweep run with `--metrics ...,case` split one trial's error into what averaging more trials cannot
remove (bias_fro_rel squared) and what it can (var_fro_rel, the spread of one trial). One panel per
estimator, a pair of bars per sample count, log scale. A dark bar that stays while the light one falls
with the samples is bias; a light bar well above the dark one is variance (averaging T trials divides
it by T).

Both quantities are relative to ||R*||_F^2, so a pair sums to about one trial's nmse
(docs/metrics.md: mean nmse = bias^2 + var*(T-1)/T). With several slices, a bar is the mean over slices.

Example:
  build/attnprobe sweep data/charlm-hd32.h5 -e performer -e ra -e 'yoso(norm=none)' --samples 16..256:x4 \\
      --layers 0 --heads 0 --batch 0 --lengths 1024 --trials 8 --metrics nmse,case -o out/bv.csv
  /usr/bin/python3 plots/bias_variance.py out/bv.csv -o out/bias-variance.png
"""
import argparse
import math
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style  # noqa: E402
from sweep_csv import integer, line_label, read_rows  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", nargs="+", help="trial CSVs from attnprobe sweep with the case metrics")
    parser.add_argument("--n", default=None, help="only this length (default: every length, averaged)")
    parser.add_argument("--title", default=None)
    parser.add_argument("-o", "--output", required=True, help="image file (.png or .svg)")
    args = parser.parse_args()

    filters = {"trial": "-1"}
    if args.n:
        filters["n"] = args.n
    rows = read_rows(args.sweep, **filters)
    # {label: {samples: {"bias2": [per slice], "var": [per slice]}}}
    cells = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        value = float(r["value"])
        if math.isnan(value):
            continue
        samples = integer(r["samples"]) or 0
        label = line_label(r)
        if r["metric"] == "bias_fro_rel":
            cells[label][samples]["bias2"].append(value * value)
        elif r["metric"] == "var_fro_rel":
            cells[label][samples]["var"].append(value)
    if not cells:
        sys.exit("bias_variance: no case rows (trial -1) with bias_fro_rel/var_fro_rel: sweep with --metrics ...,case")

    labels = sorted(cells)
    cols = min(4, len(labels))
    rows_n = (len(labels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.4 * cols, 2.9 * rows_n), squeeze=False)
    for ax, label in zip(axes.flat, labels):
        counts = sorted(cells[label])
        xs = range(len(counts))
        mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
        bias2 = [mean(cells[label][c]["bias2"]) for c in counts]
        var = [mean(cells[label][c]["var"]) for c in counts]
        # The panel's estimator in its colour: bias² solid, variance light and hatched.
        ax.bar([x - 0.2 for x in xs], bias2, width=0.4, color=style.colour(label), label="bias² (stays)")
        ax.bar([x + 0.2 for x in xs], var, width=0.4, color=style.colour(label), alpha=0.35, hatch="///",
               edgecolor=style.colour(label), label="variance (÷T)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([str(c) if c else "-" for c in counts], fontsize=8)
        ax.set_yscale("log")
        # Bars start at 0, which a log axis cannot show: the limits come from the data instead.
        values = [v for v in bias2 + var if v > 0 and not math.isnan(v)]
        if values:
            ax.set_ylim(min(values) / 3, max(values) * 3)
        ax.set_title(label, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes.flat[len(labels):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("samples knob")
    for ax in axes[:, 0]:
        ax.set_ylabel("÷ ‖R*‖²_F")
    style.legend(axes.flat[0])
    fig.suptitle(args.title or "One trial's error split: bias² (solid) vs variance (light, hatched)")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
