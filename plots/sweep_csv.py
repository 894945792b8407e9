"""Reading attnprobe's long trial CSV (docs/csv.md) for the plot scripts.

The aggregation every figure uses: per slice (dump, layer, head, batch item) the trials are
averaged first; a point is the mean over slices and its error bar the standard error over slices,
so slices are the replicates. With a single slice, the trials are the replicates.
"""
import argparse
import csv
import gzip
import io
import math
import os
import sys
from collections import defaultdict


def open_csv(path):
    """A CSV file for reading as text; a name ending in .gz is gzip-compressed (plots/data/*.csv.gz)."""
    if not os.path.exists(path):
        # Exit 3, the CLI's code for an input error (docs/cli.md).
        print(f"{path}: no such file (plots/data/ holds each figure's committed data; rerun the figure's script "
              "without --from-data to regenerate it, plots/README.md names the script)", file=sys.stderr)
        sys.exit(3)
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", newline="")
    return open(path, newline="")


def read_rows(paths, **filters):
    """All rows of the CSVs whose columns equal the given values (a callable filter is applied)."""
    rows = []
    for path in paths:
        with open_csv(path) as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or "value" not in reader.fieldnames:
                sys.exit(f"{path} is not an attnprobe trial CSV (no 'value' column)")
            for row in reader:
                if all(v(row[k]) if callable(v) else row[k] == v for k, v in filters.items()):
                    rows.append(row)
    return rows


def mean_and_se(values):
    k = len(values)
    mean = sum(values) / k
    if k < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1) / k)


def aggregate(rows, line_of, x_of):
    """{line: [(x, mean, se), ...] sorted by x}, slices as replicates (see the module doc)."""
    cells = defaultdict(lambda: defaultdict(list))
    for r in rows:
        x = x_of(r)
        if x is None:
            continue
        cells[(line_of(r), x)][(r["dump"], r["layer"], r["head"], r["batch"])].append(float(r["value"]))
    lines = defaultdict(list)
    for (line, x), slices in cells.items():
        if len(slices) == 1:
            mean, se = mean_and_se(next(iter(slices.values())))
        else:
            mean, se = mean_and_se([sum(v) / len(v) for v in slices.values()])
        lines[line].append((x, mean, se))
    for points in lines.values():
        points.sort()
    return dict(lines)


# Each estimator's default spec and samples knob, as `attnprobe list --json` prints them ("spec", "samples_knob"):
# a line is labelled by its name and the keys that differ from its defaults, so a label shows what was chosen. The
# CTest plots_defaults checks these against the registry (tests/check_plot_defaults.py).
DEFAULT_SPECS = [
    "softmax",
    "yoso(m=32,tau=8,hash=gauss,norm=l2,input=l2,grad=lsh)",
    "yoso-e(tau=8,input=l2,grad=exact)",
    "informer(d=64)",
    "linformer(d=64,std=0)",
    "linformer-jlt(d=64)",
    "skeinformer(d=64,colsample=importance,rownorm=adaptive,pilot_reuse=1)",
    "vmean",
    "favorpp(M=64,ortho=1,a=opt,variant=oprf,arf_ref=0,s=1)",
    "lara(C=64,proposal=segment,weights=decoupled,beta=1,mode=sample,noise=scaled)",
    "performer(M=64,ortho=1)",
    "performer-raw(M=64,ortho=1)",
    "ra(S=1,variant=unbiased,noise=scaled)",
    "nystrom(L=64,pinv=iterative)",
    "duo(sink=128,window=257,pattern=,threshold=0.5,fraction=-1,mix=0)",
    "expected(budget=256,sink=4,future=512,cov=1,vnorm=1,eps=0,stats=post,share=group,agg=mean)",
    "h2o(heavy=128,window=128,share=head,agg=mean)",
    "hyper(m=64,b=64,r=7,order=gray,mask=1)",
    "kdeformer(m=128,b=64,r=7,order=gray,probs=vnorm)",
    "magicpig(K=10,L=150,sink=4,window=65,min=2,floor=0.0001,anchor=auto,center=1,tables=group)",
    "moba(block=64,topk=4,share=head,agg=mean)",
    "oracle_sample(b=256)",
    "quest(page=16,budget=256,last=0,round=ceil,min_pages=3,share=head,agg=logit)",
    "scatterbrain(M=64,sparse=local,w=32,ext=0,rounds=2,features=hyp,ortho=1)",
    "snapkv(window=32,budget=256,kernel=5,pool=avg,share=head,agg=mean)",
    "sparq(r=16,k=256,window=64,realloc=1,share=group,agg=logit)",
    "streaming(sink=4,window=256,roll=1)",
    "topk(k=256,sink=0,window=0,share=head,agg=mean)",
    "topp(p=0.9,sink=0,window=0,strict=0)",
    "tova(budget=256,heads=layer,mode=replay)",
    "uniform_keys(b=64)",
    "vattention(sink=4,window=64,k=64,base=0.05,eps=0.25,delta=0.25,draw=hh)",
]
SAMPLES_KNOBS = {"yoso": "m", "informer": "d", "linformer": "d", "linformer-jlt": "d", "skeinformer": "d",
                 "favorpp": "M", "lara": "C", "performer": "M", "performer-raw": "M", "ra": "S", "nystrom": "L",
                 "expected": "budget", "h2o": "heavy",
                 "hyper": "m", "kdeformer": "m", "magicpig": "L", "moba": "topk", "oracle_sample": "b",
                 "quest": "budget", "scatterbrain": "M", "snapkv": "budget", "sparq": "k", "streaming": "window",
                 "topk": "k", "tova": "budget", "uniform_keys": "b"}
# The knobs of the seeds' estimators, which beyond_compare.py leaves out of its labels.
KNOBS = {"d", "L", "M", "S", "C", "m"}


def spec_keys(spec):
    """('lara', {'C': '64', ...}) from 'lara(C=64,...)'."""
    name, _, body = spec.partition("(")
    return name, dict(item.partition("=")[::2] for item in body.rstrip(")").split(",") if item)


DEFAULTS = dict(spec_keys(spec) for spec in DEFAULT_SPECS)


def method_label(spec, keep_knob=False):
    """'lara(C=64,proposal=segment,...)' -> 'lara' (or 'lara (C=64)' with keep_knob): the name and the keys whose
    values differ from the estimator's defaults, its samples knob only with keep_knob."""
    name, keys = spec_keys(spec)
    defaults = DEFAULTS.get(name, {})
    knob = SAMPLES_KNOBS.get(name)
    extras = [f"{key}={value}" for key, value in keys.items()
              if defaults.get(key) != value and key != knob or key == knob and keep_knob]
    return name + (f" ({', '.join(extras)})" if extras else "")


def line_label(row, keep_knob=False):
    """A row's line: its method_label, and the reference it is measured against where that is not exact attention
    ('yoso (m=8) vs yoso-e'), so a label never hides what it is compared with."""
    label = method_label(row["spec"], keep_knob)
    return label if row["reference"] == "softmax" else f"{label} vs {method_label(row['reference'])}"


def integer(text):
    return int(text) if text and text != "all" else None


def is_floor(row):
    """Exact attention's float32 path against its float64 reference: a rounding floor (~1e-7), not an estimator's
    error, which would spend most of a logarithmic error axis; figures draw it only when asked (--floor)."""
    return row["estimator"] == "softmax"


def draw_samples_lines(ax, rows, floor=False):
    """Error against the samples knob on `ax`: one line per method (mean ± s.e., slices as replicates) in its
    palette colour, the settings of one estimator in its colour with their own line style and marker; methods
    without a knob (V-Mean) as flat dashed lines with a s.e. band; exact attention's floor only with `floor`."""
    import style  # here, not at the top: `reduce` runs without matplotlib
    rows = [r for r in rows if floor or not is_floor(r)]
    knobbed = aggregate([r for r in rows if r["samples"]], line_label, lambda r: integer(r["samples"]))
    flat = aggregate([r for r in rows if not r["samples"]], line_label, lambda r: 0)
    xs_all = sorted({x for points in knobbed.values() for x, _, _ in points}) or [1, 1024]
    styles = style.settings_styles(sorted(knobbed))
    for label, points in sorted(knobbed.items()):
        xs, ys, ses = zip(*points)
        ax.errorbar(xs, ys, yerr=ses, color=style.colour(label), label=label, **styles[label])
    for label, points in sorted(flat.items()):
        _, y, se = points[0]
        ax.plot([xs_all[0], xs_all[-1]], [y, y], linestyle="--", color=style.colour(label), label=label)
        ax.fill_between([xs_all[0], xs_all[-1]], y - se, y + se, color=style.colour(label), alpha=0.12)


# Columns of the trial CSV that no figure reads: dropped from the committed data (p and mask are fixed per dump and
# sweep, the seed is recorded in the sweep's .run.json).
DROPPED = ("p", "mask", "seed")


def short_value(text):
    """A value to 6 significant digits: far below what a figure resolves (and below the trials' spread), and the
    digits past it are noise that gzip cannot compress (a 17-digit value costs ~8 bytes compressed, 6 digits ~3)."""
    try:
        return f"{float(text):.6g}"
    except ValueError:
        return text


def reduce_rows(paths, output, metrics):
    """Concatenate trial CSVs into `output`, keeping the rows of `metrics` (all if empty) and the columns the figures
    read, values to 6 significant digits (short_value). `output` ending in .gz is written gzip-compressed with a zero header time, so that rerunning a sweep whose
    rows did not change leaves the committed file byte for byte the same."""
    writer, kept, fields = None, 0, None
    raw = gzip.GzipFile(output, mode="wb", mtime=0) if output.endswith(".gz") else open(output, "wb")
    with raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as out:
        for path in paths:
            with open_csv(path) as f:
                reader = csv.DictReader(f)
                if reader.fieldnames is None or "value" not in reader.fieldnames:
                    sys.exit(f"{path} is not an attnprobe trial CSV (no 'value' column)")
                names = [c for c in reader.fieldnames if c not in DROPPED]
                if writer is None:
                    fields = names
                    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
                    writer.writeheader()
                elif names != fields:
                    sys.exit(f"{path}: columns {names} differ from the first input's {fields}; reduce them apart")
                for row in reader:
                    if not metrics or row["metric"] in metrics:
                        row["value"] = short_value(row["value"])
                        writer.writerow(row)
                        kept += 1
    if kept == 0:
        sys.exit(f"no rows of metrics {sorted(metrics)} in {', '.join(paths)}: check the sweep's --metrics")
    return kept


def sign_test(wins, n):
    """Two-sided binomial sign test p-value of `wins` out of n under p = 1/2."""
    tail = sum(math.comb(n, k) for k in range(0, min(wins, n - wins) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def reduce_draw_main(doc, reduce_trials, draw, compare=False, dumps=False):
    """The command line of a decode figure's script: `reduce TRIALS... -o DATA` (the sweeps to the committed data;
    with `dumps`, `--dump PATH...` too, passed on as reduce_trials' third argument) and `draw DATA -o PNG` (with
    `--compare CSV`, the `summarize --compare` table to print beside it)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("reduce")
    r.add_argument("trials", nargs="+")
    r.add_argument("-o", "--output", required=True)
    if dumps:
        r.add_argument("--dump", action="append", default=[], help="a dump the sweeps read")
    d = sub.add_parser("draw")
    d.add_argument("data")
    d.add_argument("-o", "--output", required=True)
    if compare:
        d.add_argument("--compare", help="the CSV of `attnprobe summarize --compare` runs to print")
    args = parser.parse_args()
    if args.step == "reduce":
        return reduce_trials(args.trials, args.output, args.dump) if dumps else reduce_trials(args.trials, args.output)
    return draw(args.data, args.output, args.compare) if compare else draw(args.data, args.output)


TRIAL_COLUMNS = ("dump", "layer", "head", "batch", "n", "p", "mask", "queries", "precision", "estimator", "spec",
                 "samples", "reference", "trial", "seed", "metric", "value")


def restore_rows(path, output, p, mask, seed):
    """A reduced data file back in the trial CSV's layout (docs/csv.md), the dropped columns filled with the values
    given (they are one value per figure's sweep), so that `attnprobe summarize --compare` pairs its settings over
    heads from the committed data alone."""
    with open_csv(path) as f, open(output, "w", newline="") as out:
        reader = csv.DictReader(f)
        writer = csv.DictWriter(out, fieldnames=TRIAL_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in reader:
            row.update(p=p, mask=mask, seed=seed)
            row.setdefault("precision", "f32")  # data reduced before the column existed: float32, as the CLI reads it
            writer.writerow(row)


def main():
    parser = argparse.ArgumentParser(description="Reduce trial CSVs to the committed data of a figure, or restore "
                                                 "a reduced file for `attnprobe summarize --compare`.")
    sub = parser.add_subparsers(dest="command", required=True)
    red = sub.add_parser("reduce", help="keep only the metrics a figure draws, concatenated, .gz-compressed if -o says")
    red.add_argument("csv", nargs="+", help="trial CSVs from attnprobe sweep")
    red.add_argument("--metrics", default="", help="comma-separated metrics to keep (default: all)")
    red.add_argument("-o", "--output", required=True, help="reduced CSV (.csv or .csv.gz)")
    res = sub.add_parser("restore", help="a reduced file in the trial CSV layout again (for summarize --compare)")
    res.add_argument("data", help="a reduced file of plots/data/")
    res.add_argument("-o", "--output", required=True, help="trial CSV to write")
    res.add_argument("--p", default="0", help="the head dim to write (dropped by reduce; pairing does not use it)")
    res.add_argument("--mask", default="full", help="the sweep's mask (the paper and beyond figures: full)")
    res.add_argument("--seed", default="0", help="the sweep's seed (default 0, the sweeps' own)")
    args = parser.parse_args()
    if args.command == "restore":
        restore_rows(args.data, args.output, args.p, args.mask, args.seed)
        return
    metrics = {m for m in args.metrics.split(",") if m}
    kept = reduce_rows(args.csv, args.output, metrics)
    print(f"{args.output}: {kept} rows")


if __name__ == "__main__":
    main()
