#!/usr/bin/env python3
"""Time and peak memory of each estimator at growing n, each (estimator, n) in its own process (issue 13).

What it measures: for every spec and length, one `attnprobe bench --threads 1 --no-sgemm` process timing
--repeat calls after a warm-up, run under GNU time for its peak resident set. It prints, per spec, the
median ms at each n, the growth t(n_last)/t(n_first) next to the linear growth n_last/n_first, and the
peak RSS over the bytes of the slice bench holds (Q, K, V in float32 and float64 and the float32 output:
n·p·(3·12 + 4) bytes at pv = p). A ratio that stays flat as n grows means memory O(n·p); a time ratio
near the length ratio means time linear in n.

Usage:
  /usr/bin/python3 bench/scaling.py                      # the linear estimators at n = 16384, 32768, 65536
  /usr/bin/python3 bench/scaling.py -e lara -e 'nystrom(L=256)' --lengths 4096,65536 --repeat 3

Run it on a quiet machine (it prints the load average before and after): timings under load are noise.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

# Every estimator whose cost is linear in n (ra, yoso-e and linformer-jlt are O(n²) by design).
DEFAULT_SPECS = ["performer", "performer(M=256)", "favorpp", "lara", "linformer(d=256)", "informer", "nystrom",
                 "nystrom(L=256)", "skeinformer(d=256)", "yoso", "hyper", "kdeformer", "scatterbrain", "vmean"]


def run_one(binary, spec, n, p, repeat):
    """Median seconds of one spec at one n and the process's peak RSS in KiB."""
    with tempfile.TemporaryDirectory() as tmp:
        out, rss = os.path.join(tmp, "bench.csv"), os.path.join(tmp, "rss")
        cmd = ["/usr/bin/time", "-f", "%M", "-o", rss, binary, "bench", "-e", spec, "--lengths", str(n), "--p", str(p),
               "--threads", "1", "--repeat", str(repeat), "--no-sgemm", "--csv", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            row = next(csv.DictReader(f))
        with open(rss) as f:
            return float(row["seconds_median"]), int(f.read().split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attnprobe", default="build/attnprobe")
    parser.add_argument("-e", "--estimator", action="append", dest="specs", help="spec to time (repeatable)")
    parser.add_argument("--lengths", default="16384,32768,65536")
    parser.add_argument("--p", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    specs = args.specs or DEFAULT_SPECS
    lengths = [int(x) for x in args.lengths.split(",")]
    if len(lengths) < 2:
        parser.error("--lengths needs at least two values")
    if not os.path.exists("/usr/bin/time"):
        sys.exit("bench/scaling.py needs GNU time (/usr/bin/time; Debian package `time`)")
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    rows = []
    for spec in specs:
        timings = [run_one(args.attnprobe, spec, n, args.p, args.repeat) for n in lengths]
        rows.append((spec, timings))
    print(f"load after: {os.getloadavg()}", file=sys.stderr)
    growth = lengths[-1] / lengths[0]
    print("| spec | " + " | ".join(f"n = {n}: ms (RSS / slice)" for n in lengths) +
          f" | t({lengths[-1]}) / t({lengths[0]}) (linear: {growth:g}) |")
    print("|---|" + "---|" * (len(lengths) + 1))
    for spec, timings in rows:
        cells = []
        for n, (seconds, rss_kib) in zip(lengths, timings):
            slice_bytes = n * args.p * (3 * 12 + 4)
            cells.append(f"{1e3 * seconds:.2f} ({1024 * rss_kib / slice_bytes:.2f})")
        print(f"| {spec} | " + " | ".join(cells) + f" | {timings[-1][0] / timings[0][0]:.2f} |")


if __name__ == "__main__":
    main()
