#!/usr/bin/env python3
"""Selection methods at decode: error against the fraction of the cache each row reads, per head.

Two steps, so that the figure is redrawn from data committed beside it:
  selection_density.py reduce TRIALS.csv... -o DATA.csv    per (dump, layer, head) and spec: the mean over batch
                                                             items of density, spec_rel, mass_recall, tail_mass,
                                                             tail_gap, topk_recall@10 (a compact CSV to commit)
  selection_density.py draw DATA.csv -o FIG.png [--budget dump=B ...]
                                                             one panel per dump: spec_rel against density, a line
                                                             per method (the median over heads, the band the
                                                             heads' interquartile range); prints, at each dump's
                                                             matched budget B, paired comparisons over heads
Methods are named from the spec: topk, topp, streaming, quest (last=0), quest-last (last=1), moba, snapkv, expected
(its default: one set per kv group), h2o, tova (its default: one cache per layer), topk-group, snapkv-group
(share=group) and tova-group (heads=group: one cache per kv group); a method's budget is the number of keys it is
asked to read per row (the prompt-compressed ones: prompt keys kept; topp has none: its points sit where its p
lands). The figure has two panels per dump: the
per-row methods, and the ones that compress the prompt or replay a cache, with the kv-group forms.
Run with Debian's Python (/usr/bin/python3: matplotlib, numpy).
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

import numpy as np

from sweep_csv import sign_test

METRICS = ["density", "spec_rel", "mass_recall", "tail_mass", "tail_gap", "topk_recall@10"]
# The methods that are a setting of another estimator: drawn in its colour, dashed with squares.
SETTING_OF = {"quest-last": "quest", "topk-group": "topk", "snapkv-group": "snapkv", "tova-group": "tova"}


def method_and_budget(spec):
    """('quest-last', 256) from 'quest(page=16,budget=256,last=1,...)'; budget None for topp."""
    name = spec.split("(")[0]
    keys = dict(re.findall(r"(\w+)=([^,)]+)", spec))
    group = "-group" if keys.get("share") == "group" and name in ("topk", "snapkv") else ""
    if name == "topk":
        return name + group, int(keys["k"]) + int(keys["sink"]) + int(keys["window"])
    if name in ("snapkv", "expected"):
        return name + group, int(keys["budget"])
    if name == "h2o":
        return name, int(keys["heavy"]) + int(keys["window"])
    if name == "tova":
        return name + ("-group" if keys["heads"] == "group" else ""), int(keys["budget"]) + 1
    if name == "streaming":
        return name, int(keys["sink"]) + int(keys["window"])
    if name == "quest":
        return ("quest-last" if keys["last"] == "1" else "quest"), int(keys["budget"])
    if name == "moba":
        return name, int(keys["block"]) * int(keys["topk"])
    return name, None


def reduce_trials(paths, out):
    cells = defaultdict(list)
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["metric"] in METRICS:
                    cells[(row["dump"], row["layer"], row["head"], row["spec"], row["metric"])].append(
                        float(row["value"]))
    per_head = defaultdict(dict)
    for (dump, layer, head, spec, metric), values in cells.items():
        per_head[(dump, int(layer), int(head), spec)][metric] = sum(values) / len(values)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["dump", "layer", "head", "method", "budget", "spec"] + METRICS)
        for (dump, layer, head, spec), values in sorted(per_head.items()):
            method, budget = method_and_budget(spec)
            writer.writerow([dump, layer, head, method, "" if budget is None else budget, spec] +
                            [f"{values.get(m, float('nan')):.9g}" for m in METRICS])
    print(f"wrote {len(per_head)} rows to {out}")


def draw(path, out, budgets):
    rows = list(csv.DictReader(open(path, newline="")))
    dumps = sorted({r["dump"] for r in rows})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import style
    fig, axes = plt.subplots(2, len(dumps), figsize=(6.2 * len(dumps), 9.0), squeeze=False)
    panels = [("per-row selections", ["topk", "topp", "streaming", "quest", "quest-last", "moba"]),
              ("compressed once, replayed, kv-group",
               ["topk", "topk-group", "snapkv", "snapkv-group", "expected", "h2o", "tova", "tova-group",
                "streaming"])]
    for column, dump in enumerate(dumps):
        for (title, methods), ax in zip(panels, axes[:, column]):
            mine = [r for r in rows if r["dump"] == dump]
            heads = len({(r["layer"], r["head"]) for r in mine})
            for method in methods:
                specs = sorted({r["spec"] for r in mine if r["method"] == method})
                points = []
                for spec in specs:
                    cell = [r for r in mine if r["spec"] == spec]
                    density = np.array([float(r["density"]) for r in cell])
                    error = np.array([float(r["spec_rel"]) for r in cell])
                    points.append((np.median(density), np.median(error), *np.percentile(error, [25, 75])))
                if not points:
                    continue
                points.sort()
                x, y, lo, hi = map(np.array, zip(*points))
                colour = style.colour(SETTING_OF.get(method, method))
                ax.plot(x, y, color=colour, label=method, ms=4, **style.setting_style(int(method in SETTING_OF)))
                ax.fill_between(x, lo, hi, color=colour, alpha=0.12, lw=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("density: keys read / keys the row sees (median over heads)")
            ax.set_ylabel("spec_rel vs softmax of the 16 decode rows")
            ax.set_title(f"{dump}, {heads} heads, last 16 rows\n{title} (line: median over heads; band: IQR)",
                         fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            style.legend(ax)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")

    # Paired comparisons over heads at each dump's matched budget: every method against topk (the oracle of its
    # size) and quest-last against streaming.
    for dump, budget in budgets.items():
        mine = [r for r in rows if r["dump"] == dump and r["budget"] == str(budget)]
        by = defaultdict(dict)
        for r in mine:
            by[r["method"]][(r["layer"], r["head"])] = float(r["spec_rel"])
        print(f"\n{dump}, budget {budget} keys: spec_rel paired over heads")
        print(f"{'A':<12} {'B':<11} {'heads':>5} {'A lower':>7} {'ties':>5} {'sign p':>8} {'median A/B':>10}")
        pairs = [(m, "topk") for m in ("streaming", "quest", "quest-last", "moba", "snapkv", "expected", "h2o", "tova")]
        pairs += [("quest-last", "streaming"), ("moba", "quest-last"), ("snapkv", "streaming"), ("h2o", "streaming"),
                  ("tova", "h2o"), ("expected", "snapkv"), ("topk-group", "topk"), ("snapkv-group", "snapkv"),
                  ("tova-group", "tova"), ("tova-group", "h2o")]
        for a, b in pairs:
            common = sorted(set(by[a]) & set(by[b]))
            if not common:
                continue
            wins = sum(by[a][h] < by[b][h] for h in common)
            ties = sum(by[a][h] == by[b][h] for h in common)
            ratio = np.median([by[a][h] / by[b][h] for h in common])
            # The sign test leaves tied heads out (no sign); all tied: no test.
            p = f"{sign_test(wins, len(common) - ties):>8.2g}" if ties < len(common) else f"{'—':>8}"
            print(f"{a:<12} {b:<11} {len(common):>5} {wins:>7} {ties:>5} {p} {ratio:>10.3g}")
        # Why heads fail: tail mass against tail gap of topk at this budget.
        topk = [r for r in mine if r["method"] == "topk"]
        if topk:
            mass = np.array([float(r["tail_mass"]) for r in topk])
            gap = np.array([float(r["tail_gap"]) for r in topk])
            error = np.array([float(r["spec_rel"]) for r in topk])
            worst = np.argsort(-error)[:3]
            print(f"topk tail_mass over heads: median {np.median(mass):.3g}, max {mass.max():.3g}; "
                  f"tail_gap median {np.median(gap):.3g}; the three worst heads (layer.head: spec_rel, tail_mass, "
                  f"tail_gap): " + ", ".join(f"{topk[i]['layer']}.{topk[i]['head']}: {error[i]:.3g}, {mass[i]:.3g}, "
                                             f"{gap[i]:.3g}" for i in worst))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("reduce")
    r.add_argument("csv", nargs="+")
    r.add_argument("-o", required=True)
    d = sub.add_parser("draw")
    d.add_argument("csv")
    d.add_argument("-o", required=True)
    d.add_argument("--budget", action="append", default=[], help="DUMP=B: the matched budget of the paired table")
    args = parser.parse_args()
    if args.step == "reduce":
        reduce_trials(args.csv, args.o)
    else:
        budgets = dict(item.split("=") for item in args.budget)
        draw(args.csv, args.o, {k: int(v) for k, v in budgets.items()})


if __name__ == "__main__":
    sys.exit(main())
