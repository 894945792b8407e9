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
import style  # noqa: E402
from sweep_csv import KNOBS, aggregate, integer, read_rows  # noqa: E402

NEW = {"favorpp", "hyper", "kdeformer", "scatterbrain"}


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
        seen = defaultdict(int)
        for label, points in sorted(knobbed.items()):
            xs, ys, ses = zip(*points)
            name = label.split(" ")[0]
            new = name in NEW
            ax.errorbar(xs, ys, yerr=ses, marker="o" if new else "s", markersize=3.5 if new else 2.5, capsize=2,
                        linestyle="-" if seen[name] == 0 else "--", linewidth=2.0 if new else 0.9,
                        color=style.colour(name), alpha=1.0 if new else 0.75, label=label)
            seen[name] += 1
        for label, points in sorted(flat.items()):
            _, y, se = points[0]
            ax.plot([xs_all[0], xs_all[-1]], [y, y], linestyle="--", color=style.colour(label), label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("samples knob (M features, m samples, d/L/C sketch size)")
        ax.set_ylabel(metric)
        ax.grid(True, which="both", alpha=0.3)
        n = sorted({r["n"] for r in rows})
        ax.set_title(f"{metric}, n = {', '.join(n)}", fontsize=10)
    # Inside the first panel, in two columns above the lines: every corner of the data holds a line a reading
    # compares (Scatterbrain's lowest on charlm, Nyström's and Skeinformer's on kwt1).
    style.room_above(axes[0][0], 0.42)
    style.legend(axes[0][0], loc="upper right", ncol=2, fontsize=6.5)
    dumps = sorted({r["dump"] for r in rows})
    fig.suptitle(args.title or f"Seeds' estimators (thin, squares) and newer ones (thick, circles) on {', '.join(dumps)}; "
                 "mean ± s.e. over slices")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"beyond_compare: wrote {args.output}")


if __name__ == "__main__":
    main()
