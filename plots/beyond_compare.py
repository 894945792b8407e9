#!/usr/bin/python3
"""Error against samples for the seeds' estimators and the newer ones (FAVOR++, HyperAttention,
KDEformer, Scatterbrain) on one dump: one panel per metric (spec_rel and MSE by default), log-log,
one line per estimator setting (mean ± standard error over slices, trials averaged per slice),
estimators without a samples knob (V-Mean) as a dashed flat line. Lines are labelled by the name
plus the options that differ between settings of the same estimator in the CSV.

  plots/beyond_compare.sh                       # runs the sweeps and draws every dump's figure
  /usr/bin/python3 plots/beyond_compare.py out/beyond/charlm-hd64.csv -o plots/figures/beyond-charlm-hd64.png
"""
import argparse
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_csv import KNOBS, aggregate, integer, read_rows  # noqa: E402

NEW = {"favorpp", "hyper", "kdeformer", "scatterbrain"}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f", "#000000", "#aec7e8"]


def parse(spec):
    name, _, body = spec.partition("(")
    return name, dict(item.partition("=")[::2] for item in body.rstrip(")").split(",") if item)


def labeller(specs):
    """spec -> label: the name plus the options (other than the samples knob) that vary among its settings."""
    by_name = defaultdict(set)
    for spec in specs:
        by_name[parse(spec)[0]].add(spec)
    labels = {}
    for name, group in by_name.items():
        options = [parse(s)[1] for s in group]
        varying = sorted({k for o in options for k in o if k not in KNOBS and len({x.get(k) for x in options}) > 1})
        for spec, o in zip(group, options):
            extras = [f"{k}={o[k]}" for k in varying]
            labels[spec] = name + (f" ({', '.join(extras)})" if extras else "")
    return labels


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="trial CSVs of the sweep")
    parser.add_argument("--metrics", default="spec_rel,mse")
    parser.add_argument("--title", default="")
    parser.add_argument("-o", "--output", required=True, help="image file (.png, .svg)")
    args = parser.parse_args()

    metrics = args.metrics.split(",")
    fig, axes = plt.subplots(1, len(metrics), figsize=(7.5 * len(metrics), 5.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        rows = read_rows(args.csv, reference="softmax", metric=metric)
        if not rows:
            sys.exit(f"beyond_compare: no rows of {metric} against softmax")
        labels = labeller({r["spec"] for r in rows})
        knobbed = aggregate([r for r in rows if r["samples"]], lambda r: labels[r["spec"]],
                            lambda r: integer(r["samples"]))
        flat = aggregate([r for r in rows if not r["samples"]], lambda r: labels[r["spec"]], lambda r: 0)
        xs_all = sorted({x for points in knobbed.values() for x, _, _ in points})
        # One colour per estimator; its second setting dashed. Newer estimators thick with circles, the
        # seeds' thin with squares.
        names = sorted({label.split(" ")[0] for label in knobbed})
        colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
        seen = defaultdict(int)
        for label, points in sorted(knobbed.items()):
            xs, ys, ses = zip(*points)
            name = label.split(" ")[0]
            new = name in NEW
            ax.errorbar(xs, ys, yerr=ses, marker="o" if new else "s", markersize=3.5 if new else 2.5, capsize=2,
                        linestyle="-" if seen[name] == 0 else "--", linewidth=2.0 if new else 0.9,
                        color=colour[name], alpha=1.0 if new else 0.75, label=label)
            seen[name] += 1
        for label, points in sorted(flat.items()):
            _, y, se = points[0]
            ax.plot([xs_all[0], xs_all[-1]], [y, y], linestyle="--", color="gray", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("samples knob (M features, m samples, d/L/C sketch size)")
        ax.set_ylabel(metric)
        ax.grid(True, which="both", alpha=0.3)
        n = sorted({r["n"] for r in rows})
        ax.set_title(f"{metric}, n = {', '.join(n)}", fontsize=10)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    dumps = sorted({r["dump"] for r in rows})
    fig.suptitle(args.title or f"Seeds' estimators (thin, squares) and newer ones (thick, circles) on {', '.join(dumps)}; "
                 "mean ± s.e. over slices")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"beyond_compare: wrote {args.output}")


if __name__ == "__main__":
    main()
