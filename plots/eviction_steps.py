#!/usr/bin/env python3
"""The replayed evicting caches (h2o, tova) against streaming and the oracle topk over decode steps, per head.

Two steps, so that the figure is redrawn from data committed beside it:
  eviction_steps.py reduce TRIALS.csv... -o DATA.csv   per (dump, n, layer, head, spec, steps): the mean over batch
                                                        items of spec_rel, mass_recall, density and keys_attended;
                                                        steps = n - W - P, the decode steps replayed between the
                                                        prompt's end P (the case's ;prefill=P) and the first of
                                                        the W measured rows (a compact CSV to commit)
  eviction_steps.py draw DATA.csv -o FIG.png [--compare COMPARE.csv]
                                                        one column per (dump, budget): spec_rel (top) and
                                                        mass_recall (bottom) against steps, a line per method
                                                        (median over heads, band the heads' interquartile range);
                                                        prints the keys each method reads (the budgets must
                                                        match) and, from `attnprobe summarize --compare`'s CSV,
                                                        the paired comparisons over heads
A method's budget B is the keys a row reads: h2o heavy + window, tova budget + 1 (the step's own key), streaming
sink + window, topk k. Run with Debian's Python (/usr/bin/python3: matplotlib, numpy).
"""
import csv
import re
import sys
from collections import defaultdict

import numpy as np

from sweep_csv import read_rows, reduce_draw_main

METRICS = ["spec_rel", "mass_recall", "density", "keys_attended"]
ORDER = ["h2o", "tova", "streaming", "topk"]


def method_and_budget(spec):
    """('h2o', 256) from 'h2o(heavy=128,window=128,...)': the keys a row of the method reads."""
    name = spec.split("(")[0]
    keys = dict(re.findall(r"(\w+)=([^,)]+)", spec))
    if name == "h2o":
        return name, int(keys["heavy"]) + int(keys["window"])
    if name == "tova":
        return name, int(keys["budget"]) + 1
    if name == "streaming":
        return name, int(keys["sink"]) + int(keys["window"])
    if name == "topk":
        return name, int(keys["k"]) + int(keys["sink"]) + int(keys["window"])
    sys.exit(f"eviction_steps.py: unexpected estimator {spec!r} (this figure has h2o, tova, streaming, topk)")


def steps_of(row):
    """n - W - P from the queries column 'last:W;prefill=P' (no prefill: P = n - W, no steps)."""
    match = re.fullmatch(r"last:(\d+)(?:;prefill=(\d+))?", row["queries"])
    if not match:
        sys.exit(f"eviction_steps.py: queries {row['queries']!r} is not a decode case (sweep with --queries last:W)")
    n, w = int(row["n"]), int(match.group(1))
    return n - w - (int(match.group(2)) if match.group(2) else n - w)


def reduce_trials(paths, out):
    cells = defaultdict(list)
    for row in read_rows(paths, metric=lambda m: m in METRICS):
        cells[(row["dump"], int(row["n"]), int(row["layer"]), int(row["head"]), row["spec"], steps_of(row),
               row["metric"])].append(
            float(row["value"]))
    rows = defaultdict(dict)
    for (dump, n, layer, head, spec, steps, metric), values in cells.items():
        rows[(dump, n, layer, head, spec, steps)][metric] = float(np.mean(values))
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["dump", "n", "layer", "head", "method", "budget", "steps", "spec", *METRICS])
        for (dump, n, layer, head, spec, steps), values in sorted(rows.items()):
            method, budget = method_and_budget(spec)
            writer.writerow([dump, n, layer, head, method, budget, steps, spec,
                             *(f"{values[m]:.6g}" if m in values else "" for m in METRICS)])
    print(f"wrote {len(rows)} rows to {out}")


def draw(data, out, compare):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import style

    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    panels = sorted({(r["dump"], int(r["budget"])) for r in rows}, key=lambda p: (p[0], p[1]))
    labels = {"h2o": "h2o (replayed)", "tova": "tova (replayed)", "streaming": "streaming (per row)",
              "topk": "topk (oracle, per row)"}
    fig, axes = plt.subplots(2, len(panels), figsize=(4.4 * len(panels), 7.4), squeeze=False)
    for column, (dump, budget) in enumerate(panels):
        mine = [r for r in rows if r["dump"] == dump and int(r["budget"]) == budget]
        heads = len({(r["layer"], r["head"]) for r in mine})
        n_steps = sorted({int(r["steps"]) for r in mine})
        for ax, metric in zip(axes[:, column], ["spec_rel", "mass_recall"]):
            for method in ORDER:
                points = []
                for steps in n_steps:
                    values = [float(r[metric]) for r in mine if r["method"] == method and int(r["steps"]) == steps]
                    if values:
                        points.append((steps, np.median(values), *np.percentile(values, [25, 75])))
                if not points:
                    continue
                x, y, low, high = (np.array(c) for c in zip(*points))
                ax.plot(x, y, "o-", color=style.colour(method), label=labels[method], markersize=4)
                ax.fill_between(x, low, high, color=style.colour(method), alpha=0.08, linewidth=0)
            ax.set_xscale("symlog", linthresh=16)  # steps start at 0: linear below 16, logarithmic above
            ax.set_xlim(-1, max(n_steps) * 1.3)
            ax.set_xticks(n_steps)
            ax.set_xticklabels([str(s) for s in n_steps], fontsize=7, rotation=45)
            ax.minorticks_off()
            ax.set_xlabel("decode steps replayed before the 16 measured rows")
            ax.grid(True, which="both", alpha=0.3)
            if metric == "spec_rel":
                ax.set_yscale("log")
                ax.set_ylabel("spec_rel vs softmax (median over heads)")
                ax.set_title(f"{dump}, n = {mine[0]['n']}\nB = {budget} keys read per row, {heads} heads", fontsize=9)
                style.legend(ax)
            else:
                ax.set_ylabel("mass_recall: softmax mass of the kept keys (median)")
    fig.suptitle("Replayed evicting caches against the window and the oracle at equal keys read "
                 "(line: median over heads; band: IQR over heads)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")

    # The budgets must match: the keys each method attends, over heads and steps.
    print("\nkeys_attended per row (min-max over heads and steps):")
    for dump, budget in panels:
        mine = [r for r in rows if r["dump"] == dump and int(r["budget"]) == budget]
        cells = []
        for method in ORDER:
            keys = [float(r["keys_attended"]) for r in mine if r["method"] == method]
            cells.append(f"{method} {min(keys):.6g}-{max(keys):.6g}")
        print(f"  {dump}, B = {budget}: " + ", ".join(cells))
    if compare:
        print_compare(compare)


def print_compare(path):
    """The paired comparisons of `attnprobe summarize --compare` (spec_rel), one line per (A, B, steps)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["metric"] == "spec_rel"]
    print("\nspec_rel paired over heads (summarize --compare): A better = heads where A is lower")
    print(f"{'dump':<26} {'A':<30} {'B':<30} {'steps':>5} {'heads':>5} {'A better':>8} {'ties':>4} {'sign p':>8} "
          f"{'A/B':>6} {'mean A-B [95% interval]':>30}")
    for r in sorted(rows, key=lambda r: (r["dump"], r["a"], r["b"], steps_of(r))):
        short = lambda s: re.sub(r",(share|agg|roll|heads|mode)=[^,)]+", "", s)
        interval = f"{float(r['diff']):+.3g} [{float(r['ci_low']):.3g}, {float(r['ci_high']):.3g}]"
        print(f"{r['dump']:<26} {short(r['a']):<30} {short(r['b']):<30} {steps_of(r):>5} {r['heads']:>5} "
              f"{r['a_better']:>8} {r['ties']:>4} {float(r['sign_p']):>8.2g} {float(r['median_ratio']):>6.3g} "
              f"{interval:>30}")


if __name__ == "__main__":
    sys.exit(reduce_draw_main(__doc__, reduce_trials, draw, compare=True))
