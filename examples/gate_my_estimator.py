#!/usr/bin/python3
"""Gate your own attention estimator in CI with attnprobe: copy this file and put yours in `my_performer`.

It measures a plain PyTorch Performer of "our team" (positive random features, Choromanski et al. 2021)
beside attnprobe's built-in performer(M=64) on the bundled dump of a trained character-level model,
on the same slices, trials and seeds, prints a summary, and compares the errors with a committed
baseline: exit code 1 when an error got worse beyond the noise (attnprobe.check), 0 otherwise.

    PYTHONPATH=build/python /usr/bin/python3 examples/gate_my_estimator.py            # the gate
    PYTHONPATH=build/python /usr/bin/python3 examples/gate_my_estimator.py --refresh  # after an intended change
    PYTHONPATH=build/python /usr/bin/python3 examples/gate_my_estimator.py --features 8  # see it fail

The baseline is examples/my_performer_baseline.csv (a summary: one row per case and metric).
"""
import argparse
import math
import os
import sys

import torch

import attnprobe

HERE = os.path.dirname(os.path.abspath(__file__))


def my_performer(features):
    """The estimator under test: fn(q, k, v, scale, causal, seed) -> n x pv, as attnprobe.sweep calls it.

    q, k (n x p) and v (n x pv) are float64 numpy arrays of one slice; `seed` is the key of (sweep
    seed, case, trial): draw from a local generator seeded with it, so every rerun repeats."""

    def fn(q, k, v, scale, causal, seed):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
        omega = torch.randn(features, q.shape[1], generator=g, dtype=q.dtype)  # ω ~ N(0, I)

        def phi(x):  # exp(ωᵀx − |x|²/2): E[φ(q)ᵀφ(k)] = exp(qᵀk), on √scale-scaled inputs
            x = x * math.sqrt(scale)
            logits = x @ omega.T - (x * x).sum(1, keepdim=True) / 2
            return torch.exp(logits - logits.max())  # one constant per matrix: cancels in the ratio

        qf, kf = phi(q), phi(k)
        return (qf @ (kf.T @ v)) / (qf @ kf.sum(0)).unsqueeze(1)

    return fn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", default=os.path.join(HERE, "..", "data", "charlm-hd32.h5"))
    parser.add_argument("--baseline", default=os.path.join(HERE, "my_performer_baseline.csv"))
    parser.add_argument("--features", type=int, default=64, help="random features of my_performer")
    parser.add_argument("--refresh", action="store_true", help="write the baseline instead of checking against it")
    args = parser.parse_args()

    # Both layers and heads of batch item 0 at 512 tokens, 8 trials each: a few seconds.
    rows = attnprobe.sweep(args.dump, ["performer(M=64)"], custom={"my_performer": my_performer(args.features)},
                           batch=0, lengths=[512], trials=8, seed=0, metrics=["spec_rel", "fro_rel", "angle"])
    summary = attnprobe.summarize(rows)
    pooled = attnprobe.summarize(summary, over=["layer", "head"])
    print(pooled[["spec", "metric", "count", "mean", "stderr"]].to_string(index=False))

    if args.refresh:
        attnprobe.write_csv(summary, args.baseline)
        print(f"wrote {len(summary)} rows to {args.baseline}")
        return 0
    report = attnprobe.check(summary, args.baseline)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
