#!/usr/bin/env python3
"""Which operator errors matter for the model: each estimator put in place of one attention head of our causal
character model (attnprobe.substitute), the change in held-out loss it causes against its operator error there.

Two steps, so that the figure is redrawn from data committed beside it:
  delta_loss.py run -o DATA.csv       per (layer, head, estimator, seed): the head's operator error (spec_rel and
                                      fro_rel of the estimate against exact attention, mean over the windows'
                                      batch items) and Δloss (nats per character, held-out next-character
                                      cross-entropy with the head substituted minus without); needs the `bible`
                                      program (Debian bible-kjv) for the held-out text, torch, and the package
  delta_loss.py draw DATA.csv -o FIG.png
                                      Δloss against spec_rel, one colour per estimator, one point per
                                      (head, estimator) at the mean over seeds with the seeds' range as bars;
                                      prints the rank correlation over heads per estimator
Model: data/models/charlm-causal.pt (2 layers × 4 query heads, 2 kv heads, head dim 32, causal). Held-out text:
the last 5% of the KJV, as the model's training held it out; windows of 512 characters after the first 8192 (the
dumped sequence), 4 batches of 2 windows. Draws: the CLI's case for each (layer, head, batch item), so a seed here
is a --seed there. Run with Debian's Python (/usr/bin/python3: torch, matplotlib, numpy) and
PYTHONPATH=build/python.
"""
import argparse
import csv
import importlib.util
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
ESTIMATORS = {  # spec → seeds (deterministic selections run one)
    "performer(M=16)": [0, 1, 2],
    "performer(M=64)": [0, 1, 2],
    "topk(k=8)": [0],
    "topk(k=32)": [0],
    "streaming(sink=4,window=28)": [0],
}
WINDOW, WINDOWS_PER_BATCH, BATCHES, SKIP = 512, 2, 4, 8192


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(out):
    import torch
    import torch.nn.functional as F

    import attnprobe

    charlm = load_tool("train_charlm")
    torch.set_num_threads(1)
    model, vocab, meta = charlm.load_checkpoint(ROOT / "data" / "models" / "charlm-causal.pt")
    model.eval()
    text = charlm.load_corpus()
    held = text[int(len(text) * 0.95):]
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in held[SKIP:SKIP + (WINDOW + 1) * WINDOWS_PER_BATCH * BATCHES]])
    chunks = ids.view(BATCHES * WINDOWS_PER_BATCH, WINDOW + 1)
    batches = [(chunks[i::BATCHES, :-1], chunks[i::BATCHES, 1:]) for i in range(BATCHES)]

    def loss_fn(model, batch):
        x, y = batch
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    layers, heads, kv_heads = meta["layers"], meta["heads"], meta.get("kv_heads", meta["heads"])
    hooks = [attnprobe.LayerSpec(q=f"blocks.{i}.attn.rotary:0", k=f"blocks.{i}.attn.rotary:1",
                                 v=f"blocks.{i}.attn.v", out=f"blocks.{i}.attn.out") for i in range(layers)]
    captured = [attnprobe.capture(model, (x,), hooks=hooks, heads=heads, kv_heads=kv_heads, causal=True)
                for x, _ in batches]
    group = heads // kv_heads
    rows = []
    for spec, seeds in ESTIMATORS.items():
        for layer in range(layers):
            for head in range(heads):
                report = attnprobe.loss_delta(model, batches, loss_fn, layer=layer, head=head, estimator=spec,
                                              seeds=seeds, hooks=hooks, heads=heads, kv_heads=kv_heads, causal=True)
                for s, seed in enumerate(seeds):
                    errors = {"spec_rel": [], "fro_rel": []}
                    for layers_of_batch in captured:
                        captured_layer = layers_of_batch[f"layer_{layer:02d}"]
                        for item in range(captured_layer.q.shape[0]):
                            q = captured_layer.q[item, head]
                            k, v = captured_layer.k[item, head // group], captured_layer.v[item, head // group]
                            exact = attnprobe.exact(q, k, v, captured_layer.scale, mask="causal")
                            estimate = attnprobe.estimate(spec, q, k, v, captured_layer.scale, seed=seed,
                                                          case={"layer": layer, "head": head, "batch": item},
                                                          mask="causal")
                            metrics = attnprobe.metrics(exact, estimate)
                            for name in errors:
                                errors[name].append(metrics[name])
                    rows.append({"layer": layer, "head": head, "spec": spec, "seed": seed,
                                 "spec_rel": np.mean(errors["spec_rel"]), "fro_rel": np.mean(errors["fro_rel"]),
                                 "delta_loss": report.deltas[s], "baseline_loss": report.baseline_loss})
                print(f"{spec} L{layer} H{head}: Δloss {np.mean(report.deltas):+.4f} nats", flush=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    print(f"wrote {len(rows)} rows to {out}")


def spearman(x, y):
    rank = lambda a: np.argsort(np.argsort(a)).astype(float)
    rx, ry = rank(np.asarray(x)), rank(np.asarray(y))
    return float(np.corrcoef(rx, ry)[0, 1]) if len(x) > 2 else math.nan


def draw(data, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import style

    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    styles = style.settings_styles(specs)  # the settings of one estimator: its colour, a marker each
    fig, ax = plt.subplots(figsize=(7.5, 5))
    baseline = float(rows[0]["baseline_loss"])
    print(f"baseline held-out loss {baseline:.4f} nats/char ({baseline / math.log(2):.3f} bits/char)")
    print("| estimator | heads | spec_rel (median) | Δloss median | Δloss max | Spearman ρ(spec_rel, Δloss) over heads |")
    print("|---|---|---|---|---|---|")
    for spec in specs:
        points = {}
        for r in rows:
            if r["spec"] == spec:
                points.setdefault((r["layer"], r["head"]), []).append((float(r["spec_rel"]), float(r["delta_loss"])))
        x = np.array([np.mean([p[0] for p in v]) for v in points.values()])
        y = np.array([np.mean([p[1] for p in v]) for v in points.values()])
        low = y - np.array([min(p[1] for p in v) for v in points.values()])
        high = np.array([max(p[1] for p in v) for v in points.values()]) - y
        ax.errorbar(x, y, yerr=[low, high], linestyle="none", marker=styles[spec]["marker"], color=style.colour(spec),
                    label=spec, markersize=5)
        print(f"| {spec} | {len(x)} | {np.median(x):.3g} | {np.median(y):+.3g} | {y.max():+.3g} | "
              f"{spearman(x, y):.2f} |")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("operator error of the head: spec_rel vs softmax (mean over 8 windows)")
    ax.set_ylabel("Δ held-out loss, nats per character")
    ax.set_title("One head of charlm-causal replaced: operator error vs change in loss")
    style.legend(ax, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("run")
    r.add_argument("-o", "--output", required=True)
    d = sub.add_parser("draw")
    d.add_argument("data")
    d.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    if args.step == "run":
        run(args.output)
    else:
        draw(args.data, args.output)


if __name__ == "__main__":
    sys.exit(main())
