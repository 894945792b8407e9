#!/usr/bin/python3
"""Why a head is hard: each slice's error for an estimator (from a sweep) against its head
diagnostics (from `attnprobe diagnose`), one point per (layer, head, batch item, n), one panel per
diagnostic. A tight trend in one panel (e.g. error rising as entropy falls) names what makes the
head hard for that estimator.

Example:
  build/attnprobe diagnose data/charlm-hd64.h5 --lengths 1024 -o out/diagnose.csv
  build/attnprobe sweep data/charlm-hd64.h5 -e 'performer(M=64)' -e 'yoso(m=32)' --lengths 1024 \\
      --trials 8 --metrics spec_rel -o out/heads.csv
  /usr/bin/python3 plots/diagnostics_vs_error.py out/diagnose.csv out/heads.csv -o out/why.png
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style  # noqa: E402
from sweep_csv import open_csv, line_label, read_rows  # noqa: E402

PANELS = ["entropy", "effective_support", "max_logit", "stable_rank", "mean_distance", "k_norm_cv"]


def slice_key(row):
    return (row["dump"], row["layer"], row["head"], row["batch"], row["n"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("diagnose", help="CSV from attnprobe diagnose")
    parser.add_argument("sweep", nargs="+", help="trial CSVs from attnprobe sweep at the same lengths")
    parser.add_argument("--metric", default="spec_rel", help="error metric (default spec_rel)")
    parser.add_argument("-o", "--output", required=True, help="image file (.png or .svg)")
    args = parser.parse_args()

    diagnostics = defaultdict(dict)
    with open_csv(args.diagnose) as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or "diagnostic" not in reader.fieldnames:
            sys.exit(f"{args.diagnose} is not an attnprobe diagnose CSV (no 'diagnostic' column)")
        for row in reader:
            diagnostics[slice_key(row)][row["diagnostic"]] = float(row["value"])

    per_slice = defaultdict(lambda: defaultdict(list))  # {label: {slice: [trial values]}}
    for row in read_rows(args.sweep, metric=args.metric):
        per_slice[line_label(row, keep_knob=True)][slice_key(row)].append(float(row["value"]))
    if not per_slice:
        sys.exit(f"no {args.metric} rows in {', '.join(args.sweep)}")

    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    styles = style.settings_styles(sorted(per_slice))
    for ax, name in zip(axes.flat, PANELS):
        for label, slices in sorted(per_slice.items()):
            points = [(diagnostics[key][name], sum(v) / len(v)) for key, v in slices.items() if key in diagnostics]
            if points:
                xs, ys = zip(*points)
                ax.scatter(xs, ys, s=14, alpha=0.75, color=style.colour(label), marker=styles[label]["marker"],
                           label=label)
        ax.set_xlabel(name)
        ax.set_ylabel(f"{args.metric} vs softmax (or as labelled)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    style.legend(axes.flat[0])
    fig.suptitle(f"Per-slice {args.metric} against head diagnostics (one point per layer, head, item and length)")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
