#!/usr/bin/env python3
"""Compares two long sweep CSVs of the same grid (e.g. --device cuda against --device cpu): the rows
must be the same cases (every column but `value` equal, same count), and for each estimator and
metric it prints the largest relative difference of the values, |a - b| / max(|b|, 1e-30).
Usage: compare_sweeps.py A.csv B.csv. Exit code 1 when the row sets differ."""
import csv
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    keyed = {}
    for row in rows:
        key = tuple((k, v) for k, v in row.items() if k != "value")
        keyed[key] = float(row["value"])
    return keyed


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    only_a, only_b = set(a) - set(b), set(b) - set(a)
    print(f"rows: {len(a)} vs {len(b)}; only in first {len(only_a)}, only in second {len(only_b)}")
    worst = defaultdict(float)
    values = defaultdict(list)
    for key in set(a) & set(b):
        d = dict(key)
        x, y = a[key], b[key]
        rel = abs(x - y) / max(abs(y), 1e-30)
        worst[(d["estimator"], d["metric"])] = max(worst[(d["estimator"], d["metric"])], rel)
        values[(d["estimator"], d["metric"])].append((x, y))
    print(f"{'estimator':<12} {'metric':<10} {'max rel diff':>12} {'max first':>12} {'max second':>12}")
    for (estimator, metric), w in sorted(worst.items()):
        xs = values[(estimator, metric)]
        print(f"{estimator:<12} {metric:<10} {w:12.3e} {max(x for x, _ in xs):12.4e} {max(y for _, y in xs):12.4e}")
    return 1 if only_a or only_b else 0


if __name__ == "__main__":
    sys.exit(main())
