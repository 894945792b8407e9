#!/usr/bin/python3
"""Error per unit of cost: each estimator's error (from a sweep) against its time per call (from
`attnprobe bench --csv`) at the same n and sample counts, one line per estimator through its sample
counts, so estimators are compared at equal cost. Lower left is better; a line that stays left of
another at every error level dominates it.

Points: the sweep's error at (spec, n) — mean over slices of each slice's mean over trials, with the
standard error over slices — against bench's median seconds for the same canonical spec and n.

Example:
  build/attnprobe sweep data/charlm-hd64.h5 -e performer -e lara -e nystrom -e skeinformer \\
      --samples 16..256:x2 --lengths 1024 --trials 8 --metrics spec_rel -o out/cost.csv
  build/attnprobe bench -e performer -e lara -e nystrom -e skeinformer --samples 16..256:x2 \\
      --lengths 1024 --p 64 --threads 1 --csv out/bench.csv
  /usr/bin/python3 plots/pareto.py out/cost.csv out/bench.csv --n 1024 -o out/pareto-1024.png
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
from sweep_csv import open_csv, aggregate, is_floor, line_label, read_rows  # noqa: E402


def read_bench(path, n):
    """{canonical spec: milliseconds per call} at length n (the median of bench's repeats)."""
    times = {}
    with open_csv(path) as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or "seconds_median" not in reader.fieldnames:
            sys.exit(f"{path} is not an attnprobe bench CSV (no 'seconds_median' column)")
        for row in reader:
            if int(row["n"]) == n:
                times[row["spec"]] = 1000 * float(row["seconds_median"])
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", nargs="+", help="trial CSVs from attnprobe sweep")
    parser.add_argument("bench", help="CSV from attnprobe bench --csv, at the same n and sample counts")
    parser.add_argument("--n", type=int, required=True, help="the length to compare at")
    parser.add_argument("--metric", default="spec_rel", help="error metric (default spec_rel)")
    parser.add_argument("--title", default=None)
    parser.add_argument("-o", "--output", required=True, help="image file (.png or .svg)")
    args = parser.parse_args()

    times = read_bench(args.bench, args.n)
    rows = [r for r in read_rows(args.sweep, metric=args.metric, n=str(args.n)) if not is_floor(r)]
    if not rows:
        sys.exit(f"no {args.metric} rows at n = {args.n} in {', '.join(args.sweep)}")
    errors = aggregate(rows, lambda r: (r["spec"], line_label(r)), lambda r: 0)  # {(spec, label): [(0, mean, se)]}
    lines = defaultdict(list)
    missing = []
    for (spec, label), [(_, mean, se)] in errors.items():
        if spec not in times:
            missing.append(spec)
            continue
        lines[label].append((times[spec], mean, se))
    if missing:
        print(f"pareto: no bench time at n = {args.n} for: {', '.join(sorted(missing))}", file=sys.stderr)
    if not lines:
        sys.exit("pareto: no spec of the sweep was timed by the bench CSV (same canonical specs and n?)")

    fig, ax = plt.subplots(figsize=(10, 6))
    styles = style.settings_styles(sorted(lines))
    for label, points in sorted(lines.items()):
        points.sort()
        ms, ys, ses = zip(*points)
        ax.errorbar(ms, ys, yerr=ses, color=style.colour(label), markersize=4, label=label, **styles[label])
    if "softmax" in times:
        ax.axvline(times["softmax"], color=style.colour("softmax"), linestyle="--", label="exact attention (time)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"milliseconds per call (n = {args.n}, bench median)")
    ax.set_ylabel(f"{args.metric} (mean ± s.e. over slices)")
    ax.set_title(args.title or f"Error against cost at n = {args.n}")
    ax.grid(True, which="both", alpha=0.3)
    style.legend(ax, ncol=2)
    fig.tight_layout()
    fig.savefig(args.output, dpi=130)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
