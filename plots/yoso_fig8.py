#!/usr/bin/python3
"""YOSO paper, Figure 8: mean angle (radians) between YOSO-m and YOSO-E outputs against sequence
length (log axis), one line per number of hashes m, with standard-error bars.

The paper's claim: the error grows only logarithmically in n and falls with m. Input: a sweep of
`yoso` with reference auto (= yoso-e with the same tau), e.g.

  build/attnprobe sweep data/synth-demo.h5 -e yoso --samples 8..128:x2 --lengths 64..1024:x2 \\
      --trials 8 --metrics angle -o out/yoso.csv
  /usr/bin/python3 plots/yoso_fig8.py out/yoso.csv -o out/yoso-fig8.png
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_csv import aggregate, integer, read_rows  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="trial CSVs of a yoso sweep")
    parser.add_argument("--hash", default=None, help="only this hash kind (gauss or hadamard)")
    parser.add_argument("-o", "--output", required=True, help="image file (.png, .svg)")
    args = parser.parse_args()

    rows = read_rows(args.csv, estimator="yoso", metric="angle", reference=lambda r: r.startswith("yoso-e"))
    if args.hash:
        rows = [r for r in rows if f"hash={args.hash}" in r["spec"]]
    if not rows:
        sys.exit("yoso_fig8: no yoso rows with metric angle against yoso-e in the input")
    lines = aggregate(rows, lambda r: integer(r["samples"]), lambda r: integer(r["n"]))

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for m in sorted(lines):
        xs, ys, ses = zip(*lines[m])
        ax.errorbar(xs, ys, yerr=ses, marker="o", markersize=3, capsize=3, label=f"m = {m}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("mean angle to YOSO-E (radians)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="hashes")
    specs = sorted({r["spec"].split("(", 1)[1].split(",", 1)[1].rstrip(")") for r in rows})
    dumps = sorted({r["dump"] for r in rows})
    ax.set_title(f"YOSO Fig. 8 on {', '.join(dumps)}\n({'; '.join(specs)}; mean ± s.e. over slices)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"yoso_fig8: wrote {args.output}")


if __name__ == "__main__":
    main()
