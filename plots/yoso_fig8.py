#!/usr/bin/python3
"""YOSO paper, Figure 8: mean angle (radians) between YOSO-m and YOSO-E outputs against sequence
length (log axis), one line per number of hashes m, with standard-error bars; beside it, when the sweep has it,
zero_rows (the share of rows that collided with no key, each counting π/2 in the angle).

The paper's claim: the error grows only logarithmically in n and falls with m. Input: a sweep of
`yoso` with reference auto (= yoso-e with the same tau), e.g.

  build/attnprobe sweep data/synth-demo.h5 -e yoso --samples 8..128:x2 --lengths 64..1024:x2 \\
      --trials 8 --metrics angle,zero_rows -o out/yoso.csv
  /usr/bin/python3 plots/yoso_fig8.py out/yoso.csv -o out/yoso-fig8.png
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style  # noqa: E402
from sweep_csv import aggregate, integer, method_label, read_rows  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="trial CSVs of a yoso sweep")
    parser.add_argument("--hash", default=None, help="only this hash kind (gauss or hadamard)")
    parser.add_argument("-o", "--output", required=True, help="image file (.png, .svg)")
    args = parser.parse_args()

    rows = read_rows(args.csv, estimator="yoso", metric=lambda m: m in ("angle", "zero_rows"),
                     reference=lambda r: r.startswith("yoso-e"))
    if args.hash:
        rows = [r for r in rows if f"hash={args.hash}" in r["spec"]]
    if not any(r["metric"] == "angle" for r in rows):
        sys.exit("yoso_fig8: no yoso rows with metric angle against yoso-e in the input")
    # zero_rows beside the angle: a row that collided with no key in any hash is zero and counts π/2 in the angle,
    # so where it is large (small head dim, few hashes) it, not the estimate's spread, sets the angle.
    metrics = [m for m in ("angle", "zero_rows") if any(r["metric"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.6 * len(metrics), 4.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        lines = aggregate([r for r in rows if r["metric"] == metric], lambda r: integer(r["samples"]),
                          lambda r: integer(r["n"]))
        # Settings of one estimator: yoso's colour, dark (few hashes) to light, one marker each.
        shades = style.shades("yoso", len(lines))
        for i, m in enumerate(sorted(lines)):
            xs, ys, ses = zip(*lines[m])
            ax.errorbar(xs, ys, yerr=ses, color=shades[i], marker=style.MARKERS[i % len(style.MARKERS)],
                        label=f"yoso (m = {m}) vs yoso-e")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length n")
        ax.grid(True, which="both", alpha=0.3)
        if metric == "angle":
            ax.set_ylabel("mean angle to yoso-e (radians)")
        else:
            ax.set_ylabel("zero_rows: share of rows with no collision")
            ax.set_ylim(bottom=0)
    # The legend where the lines leave room: zero_rows falls to 0 at the right, the angle stays high.
    style.legend(axes[0][-1], title="hashes m", loc="upper right" if len(metrics) > 1 else "best")
    taus = sorted({r["spec"].split("tau=", 1)[1].split(",", 1)[0].rstrip(")") for r in rows if "tau=" in r["spec"]})
    specs = sorted({method_label(r["spec"]) for r in rows})
    dumps = sorted({r["dump"] for r in rows})
    fig.suptitle(f"YOSO Fig. 8 on {', '.join(dumps)}: yoso vs yoso-e of the same τ\n"
                 f"({'; '.join(specs)}, τ = {', '.join(taus)}; mean ± s.e. over slices)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"yoso_fig8: wrote {args.output}")


if __name__ == "__main__":
    main()
