#!/usr/bin/env python3
"""`attnprobe bench` in alternating rounds, each point's lowest median kept: the timing protocol of
docs/performance.md for a whole bench command at once.

A machine shared with other work slows a call by whatever runs beside it, never speeds it up, so the lowest of
several medians taken at different moments is the best estimate of the quiet time. Each round runs the whole command
(every spec in turn), so a burst of load that lasts a few seconds slows one round of a point, not all of them. It
prints the 1-minute load average before and after; a point whose rounds differ by more than --spread is listed,
and the machine was not quiet enough to quote it.

Usage:
  /usr/bin/python3 bench/rounds.py --rounds 3 --csv out/bench.csv -- -e performer -e softmax --lengths 1024 \\
      --p 32 --threads 1 --repeat 3 --no-sgemm
The arguments after -- are `attnprobe bench`'s (not --csv); ATTNPROBE names the binary (default build/attnprobe).
The CSV has bench's columns; `repeats` counts the calls behind the kept median, `seconds_min` is the lowest call of
any round.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

# The columns that name a point; every other column is a measurement of it.
POINT = ("estimator", "spec", "n", "p", "samples", "threads", "device", "mask", "pass", "queries", "precision")


def load_average():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_round(binary, bench_args, path):
    """One `attnprobe bench` run; its rows."""
    subprocess.run([binary, "bench", *bench_args, "--csv", path], check=True, stdout=subprocess.DEVNULL)
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the whole command (default 3)")
    parser.add_argument("--csv", required=True, help="the merged rows: each point's round with the lowest median")
    parser.add_argument("--spread", type=float, default=1.25,
                        help="list the points whose highest round median exceeds the lowest by this factor")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then attnprobe bench's arguments")
    args = parser.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    if args.rounds < 1 or "--csv" in bench_args:
        sys.exit("rounds.py: --rounds must be ≥ 1, and --csv belongs before the -- (it is the merged file)")
    binary = os.environ.get("ATTNPROBE", "build/attnprobe")
    before = load_average()
    best, medians, lowest_call, columns = {}, {}, {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            rows = run_round(binary, bench_args, os.path.join(tmp, f"round{r}.csv"))
            columns = columns or list(rows[0].keys())
            for row in rows:
                point = tuple(row.get(c, "") for c in POINT)
                median = float(row["seconds_median"])
                medians.setdefault(point, []).append(median)
                lowest_call[point] = min(lowest_call.get(point, float("inf")), float(row["seconds_min"]))
                if point not in best or median < float(best[point]["seconds_median"]):
                    best[point] = row
            print(f"round {r + 1} of {args.rounds}: {len(rows)} points", file=sys.stderr)
    after = load_average()
    for point, row in best.items():
        row["seconds_min"] = f"{lowest_call[point]:.6g}"
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(best.values())
    print(f"rounds.py: {len(best)} points, the lowest of {args.rounds} medians each, in {args.csv}; "
          f"load average {before:.2f} before, {after:.2f} after")
    noisy = [(p, m) for p, m in medians.items() if max(m) > args.spread * min(m)]
    for point, m in noisy:
        print(f"  spread {max(m) / min(m):.2f}x: {point[1]} n={point[2]} threads={point[5]} "
              f"({', '.join(f'{x * 1e3:.3g}' for x in m)} ms)")


if __name__ == "__main__":
    main()
