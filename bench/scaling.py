#!/usr/bin/env python3
"""Time and peak memory of each estimator at growing n, each (estimator, n) in its own process (issue 13).

What it measures: for every spec and length, one `attnprobe bench --threads 1 --no-sgemm` process timing
--repeat calls after a warm-up, run under GNU time for its peak resident set. It prints, per spec, the
median ms at each n, the growth t(n_last)/t(n_first) next to the linear growth n_last/n_first, and the
peak RSS over the bytes of the slice bench holds (Q, K, V in float32 and float64 and the float32 output:
n·p·(3·12 + 4) bytes at pv = p). A ratio that stays flat as n grows means memory O(n·p); a time ratio
near the length ratio means time linear in n. The last column gives the growth of each step on its own:
an estimator that reads Q, K or V in several passes finds them in the last-level cache on the passes after
the first while the float32 working set (Q, K, V and the output, 16·n·p bytes) fits there, and in memory
once it does not. The line under the table says at which n that happens on this machine (on these 32 MiB
Zen 5 VMs: between 16384 and 32768 at p = 64), so a step across it is steeper than the steps past it.

With --rounds R every (spec, n) is timed R times in alternating rounds, and the table keeps each one's
lowest median (and highest peak RSS).

Usage:
  /usr/bin/python3 bench/scaling.py                      # the linear estimators at n = 16384, 32768, 65536
  /usr/bin/python3 bench/scaling.py --rounds 3           # the same, each point the best of three rounds
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
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every (spec, n) this many times, in alternating rounds; keep the lowest median "
                             "and the highest RSS (load from another tenant then rarely falls on one n alone)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    specs = args.specs or DEFAULT_SPECS
    lengths = [int(x) for x in args.lengths.split(",")]
    if len(lengths) < 2:
        parser.error("--lengths needs at least two values")
    if not os.path.exists("/usr/bin/time"):
        sys.exit("bench/scaling.py needs GNU time (/usr/bin/time; Debian package `time`)")
    print(f"load before: {os.getloadavg()}", file=sys.stderr)
    best = {}
    for _ in range(args.rounds):
        for spec in specs:
            for n in lengths:
                seconds, rss = run_one(args.attnprobe, spec, n, args.p, args.repeat)
                old = best.get((spec, n))
                best[(spec, n)] = (seconds, rss) if old is None else (min(old[0], seconds), max(old[1], rss))
    rows = [(spec, [best[(spec, n)] for n in lengths]) for spec in specs]
    print(f"load after: {os.getloadavg()}", file=sys.stderr)
    growth = lengths[-1] / lengths[0]
    steps = ", ".join(f"{b / a:g}" for a, b in zip(lengths, lengths[1:]))
    print("| spec | " + " | ".join(f"n = {n}: ms (RSS / slice)" for n in lengths) +
          f" | t({lengths[-1]}) / t({lengths[0]}) (linear: {growth:g}) | each step (linear: {steps}) |")
    print("|---|" + "---|" * (len(lengths) + 2))
    for spec, timings in rows:
        cells = []
        for n, (seconds, rss_kib) in zip(lengths, timings):
            slice_bytes = n * args.p * (3 * 12 + 4)
            cells.append(f"{1e3 * seconds:.2f} ({1024 * rss_kib / slice_bytes:.2f})")
        step_ratios = ", ".join(f"{b[0] / a[0]:.2f}" for a, b in zip(timings, timings[1:]))
        print(f"| {spec} | " + " | ".join(cells) + f" | {timings[-1][0] / timings[0][0]:.2f} | {step_ratios} |")
    llc = last_level_cache_bytes()
    if llc:
        working = ", ".join(f"{n}: {16 * n * args.p / 2**20:.0f} MiB" for n in lengths)
        print(f"\nLast-level cache {llc / 2**20:.0f} MiB; float32 working set (Q, K, V, output) at {working}.")


def last_level_cache_bytes():
    """The largest cache of CPU 0 from sysfs (Linux), or None."""
    sizes = []
    for index in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes) if sizes else None


if __name__ == "__main__":
    main()
