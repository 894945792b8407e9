#!/usr/bin/env python3
"""YOSO against MagicPIG at equal keys read, per head, on decode rows.

Two steps, so that the figure is redrawn from data committed beside it:
  yoso_magicpig.py reduce TRIALS.csv... --dump PATH... -o DATA.csv
      per (dump, layer, head) and (spec, reference): the mean over batch items and trials of spec_rel and angle, and
      the density of keys read. MagicPIG's is its measured `density` (the distinct keys a row attends over the keys
      it sees). YOSO's is the share of the keys its estimate sums, the keys that collide with the query in at least
      one of its m hashes, in expectation: sum_j 1 - (1 - (1 - theta_j/pi)^tau)^m over the keys the row sees
      (theta_j the angle between the query and key j; a tau-bit SimHash collides with that probability), from the
      dump's rows (needs the Python package, PYTHONPATH=build/python).
  yoso_magicpig.py draw DATA.csv -o FIG.png
      one panel per dump: spec_rel against density, a line per (method, reference) (the median over heads, the band
      the heads' interquartile range); prints the paired table: for each YOSO m and each head, MagicPIG's spec_rel
      against softmax interpolated (log-log, over L) at YOSO's density, against YOSO's spec_rel against yoso-e (its
      own target) and against softmax.
Run with Debian's Python (/usr/bin/python3: matplotlib, numpy).
"""
import csv
import functools
import math
import os
import re
import sys
from collections import defaultdict

import numpy as np

from sweep_csv import reduce_draw_main, sign_test

METRICS = ["density", "spec_rel", "angle"]


def spec_knobs(spec):
    return dict(re.findall(r"(\w+)=([^,)]+)", spec))


@functools.lru_cache(maxsize=None)
def decode_angles(path, layer, head, batch, n, rows):
    """The angles between the last `rows` queries of a slice and its n keys (read once per slice: every YOSO
    setting and reference of the slice reuses them)."""
    import attnprobe
    q, k, _, _, _ = attnprobe.load(path, layer, head, batch, length=n)
    qn = q[n - rows:] / np.linalg.norm(q[n - rows:], axis=1, keepdims=True)
    kn = k / np.linalg.norm(k, axis=1, keepdims=True)
    return np.arccos(np.clip(qn @ kn.T, -1.0, 1.0))


def yoso_density(path, layer, head, batch, n, rows, m, tau):
    """The expected share of the keys a row sees that collide with its query in at least one of m tau-bit hashes,
    averaged over the last `rows` rows of the slice (causal: row t sees keys 0..t)."""
    angle = decode_angles(path, layer, head, batch, n, rows)
    hit = -np.expm1(m * np.log1p(-((1 - angle / np.pi) ** tau)))  # 1 - (1 - p)^m, stable for small p
    shares = [hit[i, : n - rows + i + 1].mean() for i in range(rows)]
    return float(np.mean(shares))


def reduce_trials(paths, out, dumps):
    by_label = {os.path.basename(d): d for d in dumps}
    cells = defaultdict(list)
    slices = defaultdict(set)  # (dump, layer, head, spec) -> {(batch, n, rows)}
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["metric"] not in METRICS or row["trial"] == "-1":
                    continue
                key = (row["dump"], int(row["layer"]), int(row["head"]), row["spec"], row["reference"])
                cells[key + (row["metric"],)].append(float(row["value"]))
                rows = re.fullmatch(r"last:(\d+)", row["queries"])
                if not rows:
                    sys.exit(f"yoso_magicpig.py: queries {row['queries']!r} is not a decode case (--queries last:W)")
                slices[key[:4]].add((int(row["batch"]), int(row["n"]), int(rows.group(1))))
    table = defaultdict(dict)
    for (dump, layer, head, spec, reference, metric), values in cells.items():
        table[(dump, layer, head, spec, reference)][metric] = float(np.mean(values))
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["dump", "layer", "head", "method", "knob", "reference", "spec", *METRICS])
        for (dump, layer, head, spec, reference), values in sorted(table.items()):
            method, knobs = spec.split("(")[0], spec_knobs(spec)
            if method == "yoso":
                if dump not in by_label:
                    sys.exit(f"yoso_magicpig.py: YOSO's keys read need the dump: give --dump PATH for {dump}")
                values["density"] = float(np.mean([
                    yoso_density(by_label[dump], layer, head, batch, n, rows, int(knobs["m"]), int(knobs["tau"]))
                    for batch, n, rows in sorted(slices[(dump, layer, head, spec)])]))
            knob = knobs.get("m") if method == "yoso" else knobs.get("L", "")
            writer.writerow([dump, layer, head, method, knob, reference, spec,
                             *(f"{values[m]:.6g}" if m in values else "" for m in METRICS)])
    print(f"wrote {len(table)} rows to {out}")


def line_of(row):
    """The figure's line of a data row: magicpig, yoso vs softmax, yoso vs yoso-e, or yoso-e (the floor)."""
    if row["method"] == "yoso":
        return "yoso vs softmax" if row["reference"] == "softmax" else "yoso vs yoso-e (own target)"
    return row["method"]


def paired(rows):
    """Per dump and YOSO m: MagicPIG's spec_rel at YOSO's density on each head (log-log interpolation over L, heads
    where YOSO's density lies inside MagicPIG's range) against YOSO's, for both of YOSO's references."""
    by_head = defaultdict(list)
    for r in rows:
        by_head[(r["dump"], r["layer"], r["head"])].append(r)
    out = defaultdict(list)  # (dump, m, reference) -> [(magicpig, yoso)]
    for (dump, _, _), mine in by_head.items():
        pig = sorted((float(r["density"]), float(r["spec_rel"])) for r in mine if r["method"] == "magicpig")
        if len(pig) < 2:
            continue
        x, y = np.log([p[0] for p in pig]), np.log([p[1] for p in pig])
        for r in mine:
            if r["method"] != "yoso":
                continue
            at = math.log(float(r["density"]))
            if not x[0] <= at <= x[-1]:
                continue
            out[(dump, int(r["knob"]), r["reference"])].append((math.exp(np.interp(at, x, y)), float(r["spec_rel"])))
    return out


def draw(data, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import style

    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    dumps = sorted({r["dump"] for r in rows})
    fig, axes = plt.subplots(1, len(dumps), figsize=(6.2 * len(dumps), 4.8), squeeze=False)
    # (label, colour, line style, marker): YOSO's two references apart by style, MagicPIG apart by marker too (its
    # colour is near YOSO's in the palette)
    lines = [("magicpig", "magicpig", "-", "o"), ("yoso vs softmax", "yoso", "-.", "^"),
             ("yoso vs yoso-e (own target)", "yoso", "--", "s")]
    for ax, dump in zip(axes[0], dumps):
        mine = [r for r in rows if r["dump"] == dump]
        heads = len({(r["layer"], r["head"]) for r in mine})
        for label, colour_of, line_style, marker in lines:
            points = []
            for spec in sorted({r["spec"] for r in mine if line_of(r) == label}):
                cell = [r for r in mine if r["spec"] == spec and line_of(r) == label]
                error = np.array([float(r["spec_rel"]) for r in cell])
                density = np.median([float(r["density"]) for r in cell])
                points.append((density, np.median(error), *np.percentile(error, [25, 75])))
            if not points:
                continue
            points.sort()
            x, y, lo, hi = map(np.array, zip(*points))
            colour = style.colour(colour_of)
            ax.plot(x, y, color=colour, label=label, ms=4, ls=line_style, marker=marker)
            ax.fill_between(x, lo, hi, color=colour, alpha=0.12, lw=0)
        floor = [float(r["spec_rel"]) for r in mine if r["method"] == "yoso-e"]
        if floor:
            ax.axhline(np.median(floor), color=style.colour("yoso-e"), ls=":", lw=1.2,
                       label="yoso-e vs softmax (YOSO's kernel)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density: keys read / keys the row sees (median over heads)")
        ax.set_ylabel("spec_rel of the 16 decode rows")
        ax.set_title(f"{dump}, {heads} heads, last 16 rows\nYOSO m = 8..512 (tau 8), MagicPIG L = 5..300 (K 10); "
                     "band: IQR over heads", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        style.legend(ax)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")

    print("\nMagicPIG (vs softmax) at YOSO's keys read, paired over heads; 'MagicPIG lower': heads where it is below")
    print(f"{'dump':<26} {'m':>4} {'YOSO vs':<8} {'heads':>5} {'pig lower':>9} {'sign p':>8} {'median pig/yoso':>15}")
    for (dump, m, reference), pairs in sorted(paired(rows).items()):
        wins = sum(a < b for a, b in pairs)
        ratio = np.median([a / b for a, b in pairs])
        reference = reference.split("(")[0]
        print(f"{dump:<26} {m:>4} {reference:<8} {len(pairs):>5} {wins:>9} {sign_test(wins, len(pairs)):>8.2g} "
              f"{ratio:>15.3g}")


def main():
    reduce_draw_main(__doc__, reduce_trials, draw, dumps=True)


if __name__ == "__main__":
    main()
