#!/usr/bin/python3
"""A selection's kept set below float32 (docs/precision.md, "Selection below float32"): per estimator and head, how
much of the float32 kept set a bf16 or f16 case keeps (kept_overlap_f32, the Jaccard index with the float32 set of
the same draws; 1 − it on a log axis, so a lost key in a thousand is visible) and how many of the deciding scores
tie once stored in the precision (score_ties). One dot per (layer, head), batch items averaged; a head whose
kept set is unchanged sits on the "identical" line at the bottom.

  plots/selection_precision.sh        # runs the sweep (stories260K, when ../shared/data has it) and draws
  /usr/bin/python3 plots/selection_precision.py plots/data/selection-precision-stories260K.csv.gz -o out.png
  /usr/bin/python3 plots/selection_precision.py plots/data/selection-precision-stories260K.csv.gz --paired
                                      # per estimator: heads whose f16 set is nearer float32's than bf16's
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
from sweep_csv import read_rows  # noqa: E402

PRECISIONS = ("bf16", "f16")
IDENTICAL = 1e-4  # where 1 − overlap = 0 is drawn


def method_label(row):
    """The estimator's name, with tova's one-shot form told apart from its replay (both are named tova)."""
    return row["estimator"] + ("(prefill)" if "mode=prefill" in row["spec"] else "")


def per_head(rows, metric, precision):
    """{label: {(layer, head): mean over batch items and trials}} of one metric at one precision (NaN dropped)."""
    cells = defaultdict(list)
    for r in rows:
        value = float(r["value"])
        if r["metric"] == metric and r["precision"] == precision and not math.isnan(value):
            cells[(method_label(r), (r["layer"], r["head"]))].append(value)
    out = defaultdict(dict)
    for (name, head), values in cells.items():
        out[name][head] = sum(values) / len(values)
    return out


def sign_test(wins, losses):
    """Two-sided binomial sign test p of wins against losses (ties dropped)."""
    n = wins + losses
    if n == 0:
        return float("nan")
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def print_paired(rows, order):
    """Per estimator: the heads whose f16 kept set is nearer the float32 one than the bf16 set, and the reverse."""
    bf16, f16 = per_head(rows, "kept_overlap_f32", "bf16"), per_head(rows, "kept_overlap_f32", "f16")
    print(f"{'estimator':<13} {'heads':>5} {'f16 nearer':>10} {'bf16 nearer':>11} {'equal':>5} {'sign p':>8} "
          f"{'mean bf16':>9} {'mean f16':>8}   (kept_overlap_f32 per head, batch items averaged)")
    for name in order:
        heads = sorted(set(bf16[name]) & set(f16[name]))
        f16_wins = sum(f16[name][h] > bf16[name][h] for h in heads)
        bf16_wins = sum(f16[name][h] < bf16[name][h] for h in heads)
        mean_b = sum(bf16[name][h] for h in heads) / len(heads)
        mean_f = sum(f16[name][h] for h in heads) / len(heads)
        print(f"{name:<13} {len(heads):>5} {f16_wins:>10} {bf16_wins:>11} {len(heads) - f16_wins - bf16_wins:>5} "
              f"{sign_test(f16_wins, bf16_wins):>8.2g} {mean_b:>9.4f} {mean_f:>8.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="a reduced sweep (plots/data/selection-precision-NAME.csv.gz)")
    parser.add_argument("-o", "--output", help="image file (.png, .svg)")
    parser.add_argument("--paired", action="store_true", help="print the paired bf16/f16 comparison instead")
    args = parser.parse_args()
    rows = read_rows([args.data])
    if not rows:
        sys.exit(f"{args.data}: no rows")
    order = list(dict.fromkeys(method_label(r) for r in rows))
    if args.paired:
        print_paired(rows, order)
        return
    if not args.output:
        sys.exit("give -o FILE (or --paired)")
    fig, axes = plt.subplots(2, 2, figsize=(9.5, 6.2), sharex=True)
    for column, precision in enumerate(PRECISIONS):
        for row, (metric, label) in enumerate((("kept_overlap_f32", "1 − kept_overlap_f32 (keys not in the float32 set)"),
                                                ("score_ties", "score_ties (deciding scores that tie)"))):
            ax = axes[row][column]
            values = per_head(rows, metric, precision)
            for x, name in enumerate(order):
                heads = sorted(values[name])
                ys = [values[name][h] for h in heads]
                if metric == "kept_overlap_f32":
                    ys = [max(1 - y, IDENTICAL) for y in ys]
                # A fixed spread per head (its index), so the same head sits at the same x in every panel.
                xs = [x + 0.5 * ((i + 0.5) / len(heads) - 0.5) for i in range(len(heads))]
                ax.scatter(xs, ys, s=9, color=style.colour(name.split("(")[0]), alpha=0.75, linewidths=0)
            if metric == "kept_overlap_f32":
                ax.set_yscale("log")
                ax.set_ylim(IDENTICAL / 2, 1.2)
                ax.axhline(IDENTICAL, color=style.NEUTRAL, linewidth=0.6, linestyle=":")
                ax.text(len(order) - 0.5, IDENTICAL * 1.15, "identical", ha="right", va="bottom", fontsize=7,
                        color=style.NEUTRAL)
                ax.set_title(precision)
            else:
                ax.set_ylim(0, 1.02)
            if column == 0:
                ax.set_ylabel(label, fontsize=8)
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels(order, rotation=30, fontsize=8)
            ax.grid(axis="y", linewidth=0.3, alpha=0.5)
    fig.suptitle(f"kept sets in bf16 and f16 against float32, per head ({os.path.basename(args.data)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=130)
    print(f"selection_precision: wrote {args.output}")


if __name__ == "__main__":
    main()
