#!/usr/bin/python3
"""YOSO Fig. 8 for gradients: the error of YOSO's backward-pass estimates against the exact YOSO-E
gradient, against the number of hashes m (log axis), one panel per gradient metric, one colour per
backward form and one line style per sequence length n; mean ± standard error over slices.

The forms (docs/estimators/yoso.md, "Backward pass"): `yoso` (grad=lsh, the m-hash estimate of the
paper's lower bound), `yoso(grad=sparse)` (the bound over colliding pairs, §1.4), both against
`yoso-e(grad=exact)` (their reference auto); and the bound itself, `yoso-e(grad=lower)` against the
exact gradient (`--reference yoso-e`), drawn as a horizontal line per n (it draws no hashes): the gap
no number of hashes can close. Input, e.g. (docs: plots/README.md):

  build/attnprobe sweep data/charlm-hd64.h5 -e yoso -e 'yoso(grad=sparse)' --samples 8..128:x2 \\
      --lengths 256,1024 --layers 0 --batch 0 --trials 4 \\
      --metrics grad_q_fro_rel,grad_q_angle,grad_v_fro_rel,grad_pairs -o out/yoso-grad.csv
  build/attnprobe sweep data/charlm-hd64.h5 -e 'yoso-e(grad=lower)' --reference yoso-e --lengths 256,1024 \\
      --layers 0 --batch 0 --metrics grad_q_fro_rel,grad_q_angle,grad_v_fro_rel -o out/yoso-bound.csv
  /usr/bin/python3 plots/yoso_grad_fig8.py out/yoso-grad.csv out/yoso-bound.csv -o out/yoso-grad.png
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import style  # noqa: E402
from sweep_csv import aggregate, integer, read_rows  # noqa: E402

PANELS = [("grad_q_fro_rel", "‖∇̂_q̂ − ∇_q̂‖_F / ‖∇_q̂‖_F"), ("grad_q_angle", "mean row angle of ∇_q̂ (radians)"),
          ("grad_v_fro_rel", "‖∇̂_V − ∇_V‖_F / ‖∇_V‖_F")]


def form_of(spec):
    """The backward form a spec computes: 'lsh', 'sparse' or 'lower' (yoso-e's bound)."""
    if spec.startswith("yoso-e"):
        return "lower" if "grad=lower" in spec else None
    return "sparse" if "grad=sparse" in spec else "lsh"


LABELS = {"lsh": "yoso vs yoso-e (LSH estimate)", "sparse": "yoso (grad=sparse) vs yoso-e",
          "lower": "yoso-e (grad=lower) vs yoso-e (the bound)"}
# Each form in its estimator's colour (the two yoso forms are settings of yoso: filled circles and open squares).
COLOURS = {"lsh": style.colour("yoso"), "sparse": style.colour("yoso"), "lower": style.colour("yoso-e")}
MARKERS = {"lsh": {"marker": "o"}, "sparse": {"marker": "s", "markerfacecolor": "white"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="trial CSVs of yoso / yoso-e(grad=lower) sweeps with gradient metrics")
    parser.add_argument("-o", "--output", required=True, help="image file (.png, .svg)")
    args = parser.parse_args()

    names = [m for m, _ in PANELS]
    rows = read_rows(args.csv, metric=lambda m: m in names, reference=lambda r: r.startswith("yoso-e"))
    rows = [r for r in rows if form_of(r["spec"]) and r["value"] not in ("", "nan", "NaN")]
    if not rows:
        sys.exit("yoso_grad_fig8: no yoso gradient rows (grad_q_fro_rel, grad_q_angle, grad_v_fro_rel) against yoso-e")
    lengths = sorted({integer(r["n"]) for r in rows})
    line_style = {n: style.LINESTYLES[i % len(style.LINESTYLES)] for i, n in enumerate(lengths)}
    sampled = [r for r in rows if form_of(r["spec"]) != "lower"]
    ms = sorted({integer(r["samples"]) for r in sampled if integer(r["samples"])}) or [1]

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 4.3))
    for ax, (metric, ylabel) in zip(axes, PANELS):
        mine = [r for r in rows if r["metric"] == metric]
        lines = aggregate([r for r in mine if form_of(r["spec"]) != "lower"],
                          lambda r: (form_of(r["spec"]), integer(r["n"])), lambda r: integer(r["samples"]))
        for (form, n), points in sorted(lines.items()):
            xs, ys, ses = zip(*points)
            ax.errorbar(xs, ys, yerr=ses, color=COLOURS[form], linestyle=line_style[n],
                        label=f"{LABELS[form]}, n = {n}", **MARKERS[form])
        bound = aggregate([r for r in mine if form_of(r["spec"]) == "lower"], lambda r: integer(r["n"]),
                          lambda r: 0)
        for n, points in sorted(bound.items()):
            _, y, se = points[0]
            if y <= 0:  # the bound keeps the exact weights for ∇_V = Wᵀ·G: no error to draw on a log axis
                ax.text(0.02, 0.02, "yoso-e (grad=lower): 0 (its ∇_V is exact)", transform=ax.transAxes, fontsize=7,
                        color=COLOURS["lower"])
                continue
            ax.axhline(y, color=COLOURS["lower"], linestyle=line_style[n], linewidth=1.2,
                       label=f"{LABELS['lower']}, n = {n}")
            ax.axhspan(y - se, y + se, color=COLOURS["lower"], alpha=0.12)
        ax.set_xscale("log", base=2)
        ax.set_xlim(ms[0] / 1.3, ms[-1] * 1.3)
        ax.set_yscale("log")
        ax.set_xlabel("hashes m")
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_title(metric, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    # In the middle panel, between the falling estimates and the bound's flat line: free there at every m.
    style.legend(axes[1], loc="center left", fontsize=6.5)
    dumps = sorted({r["dump"] for r in rows})
    taus = sorted({part for r in rows for part in r["spec"].strip(")").split("(", 1)[-1].split(",")
                   if part.startswith("tau=")})
    fig.suptitle(f"YOSO Fig. 8 for gradients on {', '.join(dumps)} ({', '.join(taus)}): error against the exact "
                 "YOSO-E gradient (mean ± s.e. over slices)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"yoso_grad_fig8: wrote {args.output}")


if __name__ == "__main__":
    main()
