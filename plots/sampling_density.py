#!/usr/bin/env python3
"""Sampling against selection at decode: error against the fraction of the cache each row reads, per head.

Two steps, so that the figure is redrawn from data committed beside it:
  sampling_density.py reduce TRIALS.csv... -o DATA.csv   per (dump, layer, head, spec): the mean over batch items
                                                          and trials of density, spec_rel, mass_recall and
                                                          eps_cover (a compact CSV to commit)
  sampling_density.py draw DATA.csv -o FIG.png            one panel per dump: spec_rel against density, a line per
                                                          method (the median over heads at each setting, the band
                                                          the heads' interquartile range)
Methods are named from the spec: topk (the oracle selection), streaming (4 sinks and a window), oracle_sample
(b draws from the exact weights; its density counts the distinct keys drawn), magicpig (over L, K = 10) and
vattention (over its pilot fraction `base`). density is keys attended over keys visible, averaged over rows.
Run with Debian's Python (/usr/bin/python3: matplotlib, numpy).
"""
import csv
import sys
from collections import defaultdict

import numpy as np

from sweep_csv import read_rows, reduce_draw_main

METRICS = ["density", "spec_rel", "mass_recall", "eps_cover"]
ORDER = ["topk", "streaming", "oracle_sample", "magicpig", "vattention"]


def reduce_trials(paths, out):
    """eps_cover is NaN for the selections (it is a sampler's metric), and so is its mean there."""
    cells = defaultdict(list)
    for row in read_rows(paths, metric=lambda m: m in METRICS):
        cells[(row["dump"], row["layer"], row["head"], row["spec"], row["metric"])].append(float(row["value"]))
    rows = defaultdict(dict)
    for (dump, layer, head, spec, metric), values in cells.items():
        rows[(dump, layer, head, spec)][metric] = float(np.mean(values))
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["dump", "layer", "head", "spec", *METRICS])
        for key, values in rows.items():
            writer.writerow([*key, *(f"{values[m]:.6g}" if m in values else "" for m in METRICS)])
    print(f"wrote {len(rows)} rows to {out}")


def draw(data, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import style

    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    dumps = list(dict.fromkeys(r["dump"] for r in rows))
    fig, axes = plt.subplots(1, len(dumps), figsize=(6 * len(dumps), 4.6), squeeze=False)
    for ax, dump in zip(axes[0], dumps):
        by_method = defaultdict(lambda: defaultdict(list))  # method → spec → [(density, spec_rel)] over heads
        for r in rows:
            if r["dump"] == dump:
                by_method[r["spec"].split("(")[0]][r["spec"]].append((float(r["density"]), float(r["spec_rel"])))
        for method in ORDER:
            if method not in by_method:
                continue
            points = sorted((np.median([p[0] for p in heads]), np.median([p[1] for p in heads]),
                             np.percentile([p[1] for p in heads], 25), np.percentile([p[1] for p in heads], 75))
                            for heads in by_method[method].values())
            x, y, low, high = (np.array(c) for c in zip(*points))
            ax.plot(x, y, "o-", color=style.colour(method), label=method, markersize=4)
            ax.fill_between(x, low, high, color=style.colour(method), alpha=0.12, linewidth=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density: keys attended / keys visible (median over heads)")
        ax.set_ylabel("spec_rel vs softmax (median over heads)")
        ax.set_title(f"{dump}, last 16 rows (decode)")
        ax.grid(True, which="both", alpha=0.3)
        style.legend(ax, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(reduce_draw_main(__doc__, reduce_trials, draw, compare=False))
