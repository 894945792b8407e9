#!/usr/bin/python3
"""Times attnprobe.estimate() at 4096 x 64 beside `attnprobe bench` for the same estimators (docs/python.md,
"Speed"): 3 rounds, each `bench -e SPEC --lengths 4096 --p 64 --threads 1 --repeat R --no-sgemm` then R timed
estimate(SPEC, q, k, v) calls on N(0,1) float64 arrays, R on the same as float32 C-contiguous arrays, and R
estimate(SPEC, Slice) calls (threads=1); prints the minimum and the median, each as a ratio to bench's. Only
meaningful on a quiet machine: it prints `uptime` first.

    REPEAT=30 PYTHONPATH=build/python /usr/bin/python3 tools/python_speed.py build/attnprobe vmean "performer(M=64)"
"""
import os, subprocess, sys, tempfile, time, statistics
import numpy as np
import attnprobe
specs = sys.argv[2:] or ["performer(M=64)", "softmax", "yoso(m=32,tau=8)", "nystrom(L=64)", "skeinformer(d=64)", "vmean"]
binary, n, p, repeat = sys.argv[1], 4096, 64, int(os.environ.get("REPEAT", 15))
rng = np.random.default_rng(0)
q, k, v = (rng.normal(size=(n, p)) for _ in range(3))
q32, k32, v32 = (np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))
sl = attnprobe.Slice(q, k, v)
print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
def py_time(spec, mode):
    call = {"slice": lambda: attnprobe.estimate(spec, sl, threads=1),
            "f64": lambda: attnprobe.estimate(spec, q, k, v, threads=1),
            "f32": lambda: attnprobe.estimate(spec, q32, k32, v32, threads=1)}[mode]
    call()
    t = []
    for _ in range(repeat):
        s = time.perf_counter(); call(); t.append(time.perf_counter() - s)
    return min(t), statistics.median(t)
def bench_time(spec):
    import csv
    subprocess.run([binary, "bench", "-e", spec, "--lengths", str(n), "--p", str(p), "--threads", "1",
                    "--repeat", str(repeat), "--no-sgemm", "--csv", os.path.join(tempfile.gettempdir(), "attnprobe_speed_bench.csv")], capture_output=True,
                   text=True, check=True)
    row = list(csv.DictReader(open(os.path.join(tempfile.gettempdir(), "attnprobe_speed_bench.csv"))))[-1]
    return float(row["seconds_min"]), float(row["seconds_median"])
for spec in specs:
    rows = []
    for _ in range(3):
        rows.append((bench_time(spec), py_time(spec, "f64"), py_time(spec, "f32"), py_time(spec, "slice")))
    b = [min(r[i][0] for r in rows) for i in range(4)]
    a = [statistics.median(r[i][1] for r in rows) for i in range(4)]
    print(f"{spec:20s} min ms: bench {b[0]*1e3:7.3f} f64 {b[1]*1e3:7.3f} ({b[1]/b[0]:.2f}x) f32 {b[2]*1e3:7.3f} "
          f"({b[2]/b[0]:.2f}x) Slice {b[3]*1e3:7.3f} ({b[3]/b[0]:.2f}x) | median ms: bench {a[0]*1e3:7.3f} f64 "
          f"{a[1]*1e3:7.3f} ({a[1]/a[0]:.2f}x) f32 {a[2]*1e3:7.3f} ({a[2]/a[0]:.2f}x) Slice {a[3]*1e3:7.3f} "
          f"({a[3]/a[0]:.2f}x)", flush=True)
