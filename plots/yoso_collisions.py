"""Why YOSO's rows go empty: for each query, the number of keys a τ-bit SimHash is expected to put in its bucket,
Σ_j (1 − θ_ij/π)^τ (θ_ij the angle between query i and key j; SimHash collides with that probability whatever the
head dim), and the angle to its nearest key, over the first n tokens of every head of batch item 0 of each dump.

    /usr/bin/python3 plots/yoso_collisions.py data/charlm-hd64.h5 data/synth-demo.h5 ../shared/data/stories260K.h5

Needs the Python package (PYTHONPATH=build/python); prints one line per dump (plots/README.md, YOSO Figure 8).
"""
import argparse

import numpy as np

import attnprobe


def _has(path: str, layer: int, head: int, n: int) -> bool:
    try:
        attnprobe.load(path, layer, head, 0, length=n)
        return True
    except attnprobe.InputError:
        return False


def collision_stats(path: str, n: int, tau: int) -> dict:
    expected, nearest = [], []
    layer = 0
    # Layers 0, 1, ... and heads 0, 1, ... until the dump has no more (load names what is missing).
    while _has(path, layer, 0, n):
        head = 0
        while _has(path, layer, head, n):
            q, k, _, _, _ = attnprobe.load(path, layer, head, 0, length=n)
            qn = q / np.linalg.norm(q, axis=1, keepdims=True)
            kn = k / np.linalg.norm(k, axis=1, keepdims=True)
            angle = np.arccos(np.clip(qn @ kn.T, -1.0, 1.0))
            expected.append(((1 - angle / np.pi) ** tau).sum(1))
            nearest.append(angle.min(1))
            head += 1
        layer += 1
    expected, nearest = np.concatenate(expected), np.concatenate(nearest)
    return {"rows": expected.size, "mean": expected.mean(), "median": np.median(expected),
            "below_half": (expected < 0.5).mean(), "nearest_angle": nearest.mean()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dumps", nargs="+")
    parser.add_argument("--n", type=int, default=64, help="tokens per slice (the figure's shortest length)")
    parser.add_argument("--tau", type=int, default=8, help="bits per hash (YOSO's default)")
    args = parser.parse_args()
    for path in args.dumps:
        s = collision_stats(path, args.n, args.tau)
        print(f"{path}: {s['rows']} query rows; expected colliding keys per hash: mean {s['mean']:.2f}, median "
              f"{s['median']:.2f}, under 0.5 for {s['below_half']:.0%} of rows; nearest key at {s['nearest_angle']:.2f} "
              "rad on average")


if __name__ == "__main__":
    main()
