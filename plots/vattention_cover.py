#!/usr/bin/env python3
"""vAttention's (eps, delta) promise against the measured eps_cover, per head.

Two steps, so that the figure is redrawn from data committed beside it:
  vattention_cover.py reduce TRIALS.csv... -o DATA.csv  per (dump, layer, head, spec): the mean over batch items and
                                                         trials of eps_cover (the fraction of rows with
                                                         |o_hat - o| <= eps |o|, at the spec's own eps), its standard
                                                         error over those cases, spec_rel, density, den_rel and
                                                         pilot (a compact CSV to commit)
  vattention_cover.py draw DATA.csv -o FIG.png [--compare COMPARE.csv]
                                                         top: eps_cover per head against 1 - delta over the (eps,
                                                         delta) grid (draw=hh, base=0.05), the promise the diagonal;
                                                         bottom: at two pairs, the pilot fraction and the weighting
                                                         varied, the promise a bar; prints the heads that keep the
                                                         promise per setting and summarize --compare's pairs
Run with Debian's Python (/usr/bin/python3: matplotlib, numpy).
"""
import csv
import math
import re
import sys
from collections import defaultdict

import numpy as np

from sweep_csv import read_rows, reduce_draw_main

METRICS = ["eps_cover", "spec_rel", "density", "den_rel", "pilot"]
DEFAULTS = {"base": "0.05", "draw": "hh"}


def knobs(spec):
    """eps, delta, base, draw of a vattention spec (the written spec carries every key)."""
    if not spec.startswith("vattention("):
        sys.exit(f"vattention_cover.py: unexpected estimator {spec!r} (this figure has vattention only)")
    keys = dict(re.findall(r"(\w+)=([^,)]+)", spec))
    return float(keys["eps"]), float(keys["delta"]), keys.get("base", DEFAULTS["base"]), keys.get("draw", "hh")


def reduce_trials(paths, out):
    cells = defaultdict(list)
    for row in read_rows(paths, metric=lambda m: m in METRICS):
        cells[(row["dump"], int(row["layer"]), int(row["head"]), row["spec"], row["metric"])].append(
            float(row["value"]))
    rows = defaultdict(dict)
    for (dump, layer, head, spec, metric), values in cells.items():
        rows[(dump, layer, head, spec)][metric] = float(np.mean(values))
        if metric == "eps_cover":  # its standard error over the (batch item, trial) cases behind the mean
            se = np.std(values, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
            rows[(dump, layer, head, spec)]["eps_cover_se"] = float(se)
    columns = ["eps_cover", "eps_cover_se", "spec_rel", "density", "den_rel", "pilot"]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["dump", "layer", "head", "eps", "delta", "base", "draw", "spec", *columns])
        for (dump, layer, head, spec), values in sorted(rows.items()):
            eps, delta, base, draw = knobs(spec)
            writer.writerow([dump, layer, head, eps, delta, base, draw, spec,
                             *(f"{values[m]:.6g}" if m in values else "" for m in columns)])
    print(f"wrote {len(rows)} rows to {out}")


def variant_label(r):
    if r["draw"] != DEFAULTS["draw"]:
        return f"draw={r['draw']}"
    if r["base"] != DEFAULTS["base"]:
        return f"base={r['base']}"
    return "default"


def draw(data, out, compare):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import style

    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    dumps = list(dict.fromkeys(r["dump"] for r in rows))
    epss = sorted({float(r["eps"]) for r in rows})
    # Every dot is a vattention setting: its colour, one shade and marker per eps (dark: the smallest).
    colours = dict(zip(epss, style.shades("vattention", len(epss))))
    markers = {eps: style.MARKERS[i % len(style.MARKERS)] for i, eps in enumerate(epss)}
    fig, axes = plt.subplots(2, len(dumps), figsize=(6.4 * len(dumps), 9.0), squeeze=False)
    rng = np.random.default_rng(0)  # horizontal jitter of the head dots only
    for column, dump in enumerate(dumps):
        mine = [r for r in rows if r["dump"] == dump]
        heads = len({(r["layer"], r["head"]) for r in mine})
        ax = axes[0, column]
        grid = [r for r in mine if variant_label(r) == "default"]
        for i, eps in enumerate(epss):
            for delta in sorted({float(r["delta"]) for r in grid}):
                cover = np.array([float(r["eps_cover"]) for r in grid
                                  if float(r["eps"]) == eps and float(r["delta"]) == delta])
                if not len(cover):
                    continue
                x = 1 - delta + (i - (len(epss) - 1) / 2) * 0.013
                ax.scatter(x + rng.uniform(-0.003, 0.003, len(cover)), cover, s=9, color=colours[eps], alpha=0.55,
                           marker=markers[eps], linewidths=0)
                ax.plot([x - 0.005, x + 0.005], [np.median(cover)] * 2, color=colours[eps], lw=2.2,
                        label=f"eps = {eps:g} (dots: heads, bar: median)" if delta == 0.05 else None)
        ax.plot([0.5, 1.0], [0.5, 1.0], "--", color=style.NEUTRAL, lw=1, label="promise: eps_cover = 1 - delta")
        ax.set_xlim(0.54, 0.99)
        ax.set_ylim(0.2, 1.03)  # room below the heads for the legend
        ax.set_xticks([1 - d for d in sorted({float(r["delta"]) for r in grid})])
        ax.set_xlabel("1 - delta (the promised coverage)")
        ax.set_ylabel("eps_cover vs softmax: rows with |o_hat - o| <= eps |o|")
        ax.set_title(f"{dump}, last 16 rows, {heads} heads, 8 trials\nvattention(eps, delta), draw=hh, base=0.05",
                     fontsize=9)
        ax.grid(True, alpha=0.3)
        style.legend(ax, loc="lower right")

        ax = axes[1, column]
        order = ["default", "base=0.01", "base=0.2", "draw=ref", "draw=wor"]
        pairs = sorted({(float(r["eps"]), float(r["delta"])) for r in mine if variant_label(r) != "default"})
        ticks, labels = [], []
        for j, (eps, delta) in enumerate(pairs):
            for k, variant in enumerate(order):
                cover = np.array([float(r["eps_cover"]) for r in mine if float(r["eps"]) == eps and
                                  float(r["delta"]) == delta and variant_label(r) == variant])
                if not len(cover):
                    continue
                x = j * (len(order) + 1) + k
                ax.scatter(x + rng.uniform(-0.15, 0.15, len(cover)), cover, s=9, color=colours[eps], alpha=0.55,
                           marker=markers[eps], linewidths=0)
                ax.plot([x - 0.3, x + 0.3], [np.median(cover)] * 2, color=colours[eps], lw=2.2)
                ticks.append(x)
                labels.append(variant)
            left, right = j * (len(order) + 1) - 0.5, j * (len(order) + 1) + len(order) - 0.5
            ax.plot([left, right], [1 - delta] * 2, "--", color=style.NEUTRAL, lw=1)
            ax.text((left + right) / 2, 0.02, f"eps = {eps:g}, delta = {delta:g}", ha="center", fontsize=8,
                    transform=ax.get_xaxis_transform())
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, rotation=30, fontsize=8)
        ax.set_ylabel("eps_cover vs softmax (dashed: 1 - delta)")
        ax.set_title(f"{dump}: the pilot fraction (base) and the weighting (draw) varied", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")

    print("\nheads keeping the promise (eps_cover >= 1 - delta), per setting:")
    print(f"{'dump':<26} {'eps':>5} {'delta':>5} {'variant':<10} {'kept':>7} {'min':>6} {'median':>6} "
          f"{'density':>7} {'den_rel':>8} {'spec_rel':>8} {'pilot':>7} {'se':>6}")
    for dump in dumps:
        settings = sorted({(float(r["eps"]), float(r["delta"]), variant_label(r)) for r in rows if r["dump"] == dump})
        for eps, delta, variant in settings:
            cell = [r for r in rows if r["dump"] == dump and float(r["eps"]) == eps and float(r["delta"]) == delta
                    and variant_label(r) == variant]
            cover = np.array([float(r["eps_cover"]) for r in cell])
            mean = lambda m: np.mean([float(r[m]) for r in cell])
            print(f"{dump:<26} {eps:>5g} {delta:>5g} {variant:<10} {int(np.sum(cover >= 1 - delta)):>3}/{len(cell):<3} "
                  f"{cover.min():>6.3f} {np.median(cover):>6.3f} {mean('density'):>7.3f} {mean('den_rel'):>8.3g} "
                  f"{mean('spec_rel'):>8.3g} {mean('pilot'):>7.1f} {np.median([float(r['eps_cover_se']) for r in cell]):>6.3f}")
    # den_rel is a mean over rows of |D_hat/D - 1|, so by Markov's inequality at most den_rel/eps of a head's rows
    # miss eps on the denominator; where the rows missing eps on the output exceed that, some output misses lie on
    # rows whose denominator is within eps: the budget guarded D and the output still missed.
    print("\nheads below 1 - delta (draw=hh, base=0.05): rows missing eps on the output against Markov's bound "
          "den_rel/eps on those missing it on the denominator")
    for dump in dumps:
        failing = [r for r in rows if r["dump"] == dump and variant_label(r) == "default"
                   and float(r["eps_cover"]) < 1 - float(r["delta"])]
        beyond = [r for r in failing if 1 - float(r["eps_cover"]) > float(r["den_rel"]) / float(r["eps"])]
        print(f"  {dump}: {len(beyond)} of {len(failing)} (head, eps, delta) cells miss more rows on the output than "
              f"the denominator can; median ratio of the two: "
              + (f"{np.median([(1 - float(r['eps_cover'])) * float(r['eps']) / float(r['den_rel']) for r in failing]):.2f}"
                 if failing else "—"))
    if compare:
        with open(compare, newline="") as f:
            pairs = list(csv.DictReader(f))
        print("\npaired over heads (summarize --compare): A better = heads where A is better for the metric "
              "(eps_cover: higher)")
        short = lambda s: re.sub(r"(sink|window|k)=[^,)]+,?", "", s).replace(",)", ")")
        for r in pairs:
            if r["metric"] not in ("eps_cover", "spec_rel"):
                continue
            print(f"{r['dump']:<26} {short(r['a']):<42} {short(r['b']):<34} {r['metric']:<9} {r['heads']:>3} "
                  f"A better {r['a_better']:>3} B better {r['b_better']:>3} ties {r['ties']:>3} "
                  f"p {float(r['sign_p']):<7.2g} A-B {float(r['diff']):+.3g} "
                  f"[{float(r['ci_low']):.3g}, {float(r['ci_high']):.3g}]")


if __name__ == "__main__":
    sys.exit(reduce_draw_main(__doc__, reduce_trials, draw, compare=True))
