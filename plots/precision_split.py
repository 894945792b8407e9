#!/usr/bin/python3
"""Rounding against approximation per estimator and head (docs/precision.md): for bf16 and f16, each head's
approximation error (approx_err: the estimator in float32 against float64 exact attention) on the x axis and the
rounding excess (round_excess: the same draws in bf16/f16 against float32) on the y axis, log-log, one marker per
(estimator, head), trials averaged per head. The dotted line is exact attention's rounding floor in that precision
(round_floor, median over heads); the grey diagonal is where rounding would equal approximation. A point below the
diagonal is an estimator whose own error dominates its deployment in that dtype.

  plots/precision_split.sh                       # runs the sweeps and draws every dump's figure
  /usr/bin/python3 plots/precision_split.py plots/data/precision-split-charlm-hd64.csv.gz -o out.png
  /usr/bin/python3 plots/precision_split.py plots/data/precision-split-synth-large.csv.gz --nonfinite
                                                 # the fraction of non-finite rows per layer, estimator, precision
"""
import argparse
import os
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style  # noqa: E402
from sweep_csv import read_rows  # noqa: E402

PRECISIONS = ("bf16", "f16")


def per_head(rows, metric, precision):
    """{(estimator, (layer, head, batch)): mean over trials} of one metric at one precision."""
    cells = defaultdict(list)
    for r in rows:
        if r["metric"] == metric and r["precision"] == precision:
            cells[(r["estimator"], (r["layer"], r["head"], r["batch"]))].append(float(r["value"]))
    return {key: sum(v) / len(v) for key, v in cells.items()}


def print_nonfinite(rows):
    """The fraction of non-finite rows, mean over heads and trials, per layer × estimator × precision."""
    cells = defaultdict(list)
    for r in rows:
        if r["metric"] == "nonfinite_rows":
            cells[(r["layer"], r["estimator"], r["precision"])].append(float(r["value"]))
    print(f"{'layer':>5}  {'estimator':<14} {'f32':>8} {'bf16':>8} {'f16':>8}   (fraction of non-finite rows)")
    for layer, name in sorted({(layer, name) for layer, name, _ in cells}):
        values = [statistics.mean(cells.get((layer, name, p), [float("nan")])) for p in ("f32", "bf16", "f16")]
        print(f"{layer:>5}  {name:<14} " + " ".join(f"{v:8.4g}" for v in values))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="a reduced sweep (plots/data/precision-split-NAME.csv.gz)")
    parser.add_argument("-o", "--output", help="image file (.png, .svg)")
    parser.add_argument("--nonfinite", action="store_true",
                        help="print the mean nonfinite_rows per layer, estimator and precision instead of drawing")
    args = parser.parse_args()

    rows = read_rows([args.data])
    if not rows or "precision" not in rows[0]:
        sys.exit(f"precision_split: {args.data} has no precision column (a sweep with --precision)")
    if args.nonfinite:
        return print_nonfinite(rows)
    if not args.output:
        parser.error("-o/--output is required unless --nonfinite")
    fig, axes = plt.subplots(1, len(PRECISIONS), figsize=(7.2 * len(PRECISIONS), 5.8), squeeze=False)
    for ax, precision in zip(axes[0], PRECISIONS):
        approx = per_head(rows, "approx_err", precision)
        excess = per_head(rows, "round_excess", precision)
        floors = [v for (name, _), v in per_head(rows, "round_floor", precision).items() if name == "softmax"]
        broken = {name for (name, _), v in per_head(rows, "nonfinite_rows", precision).items() if v > 0}
        for name in sorted({name for name, _ in approx} - {"softmax"}):
            keys = [key for key in approx if key[0] == name and key in excess]
            xs, ys = [approx[k] for k in keys], [excess[k] for k in keys]
            label = name + (" (non-finite rows)" if name in broken else "")
            ax.scatter(xs, ys, s=14, alpha=0.8, color=style.colour(name), label=label,
                       marker="x" if name in broken else "o")
        # softmax's own point (approx_err ~1e-7) is the floor line, not a marker: the axes span the estimators'.
        shown = [v for key, v in list(approx.items()) + list(excess.items()) if key[0] != "softmax" and v > 0]
        lo, hi = min(shown + floors) / 2, max(shown) * 2
        ax.plot([lo, hi], [lo, hi], color="0.6", linewidth=0.8, label="rounding = approximation")
        ax.axhline(statistics.median(floors), color="black", linestyle=":", linewidth=1.0,
                   label=f"exact attention's floor in {precision} (median {statistics.median(floors):.2g})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("approx_err: ‖R̂ − R*‖/‖R*‖ (float32)")
        ax.set_ylabel(f"round_excess: ‖R̂_{precision} − R̂‖/‖R*‖")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{precision}: one point per estimator and head", fontsize=10)
        style.legend(ax, loc="upper left", fontsize=7)
    dumps = sorted({r["dump"] for r in rows})
    n = sorted({r["n"] for r in rows})
    # Decode steps say which rows they are (files reduced before the queries column read as whole slices).
    queries = sorted({r.get("queries") or "all" for r in rows} - {"all"})
    rows_part = f", queries {', '.join(queries)} (decode steps)" if queries else ""
    fig.suptitle(f"Rounding vs approximation on {', '.join(dumps)}, n = {', '.join(n)}{rows_part}: "
                 "same draws in every precision")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"precision_split: wrote {args.output}")


if __name__ == "__main__":
    main()
