#!/usr/bin/python3
"""LARA paper, Figure 1: MSE against the number of samples (log-log), one panel per sequence
length, lines for Performer (M random features), LARA (C proposals) and RA (S samples per query),
mean ± standard error.

The paper's claim (ViT, N = 196, 576, 784): RA with one sample is lowest, LARA falls steadily with
samples, Performer plateaus high. RA costs O(n^2 p S), so sweep it separately with few samples and
pass both CSVs:

  build/attnprobe sweep data/synth-demo.h5 -e performer -e lara --samples 8..1024:x2 --lengths 256,512,1024 \\
      --trials 8 --metrics mse -o out/lara.csv
  build/attnprobe sweep data/synth-demo.h5 -e ra -e vmean --samples 1,2,4 --lengths 256,512,1024 \\
      --trials 8 --metrics mse -o out/lara-ra.csv
  /usr/bin/python3 plots/lara_fig1.py out/lara.csv out/lara-ra.csv -o out/lara-fig1.png
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="trial CSVs with performer, lara, ra (and vmean) rows")
    parser.add_argument("--metric", default="mse")
    parser.add_argument("-o", "--output", required=True, help="image file (.png, .svg)")
    args = parser.parse_args()

    rows = read_rows(args.csv, reference="softmax", metric=args.metric,
                     estimator=lambda e: e in ("performer", "lara", "ra", "vmean"))
    if not rows:
        sys.exit("lara_fig1: no performer/lara/ra rows against softmax in the input")
    lengths = sorted({int(r["n"]) for r in rows if r["n"] != "all"})
    fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4.2), squeeze=False)
    for column, (ax, n) in enumerate(zip(axes[0], lengths)):
        subset = [r for r in rows if r["n"] == str(n)]
        draw_samples_lines(ax, subset)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("samples (M for performer, C for lara, S for ra)")
        ax.set_ylabel(args.metric)
        ax.set_title(f"n = {n}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if column == 0:  # the same lines in every panel
            style.legend(ax)
    dumps = sorted({r["dump"] for r in rows})
    fig.suptitle(f"LARA Fig. 1 on {', '.join(dumps)} (mean ± s.e. over slices)")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"lara_fig1: wrote {args.output}")


if __name__ == "__main__":
    main()
