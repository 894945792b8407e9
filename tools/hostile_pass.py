#!/usr/bin/python3
"""The hostile pass of issue 12, repeatable: malformed dumps x 3 commands, option and spec strings,
malformed CSVs for `check`, unwritable outputs, concurrent writers, kills then --resume; and the classes
of issue 48's hold-out pass: statistics that fool the gate, outputs over inputs, resumes against a changed
dump or grid, costs before checks, ambiguous input (duplicate keys, hostile names, synth overflow, pipes).

Usage: tools/hostile_pass.py [--attnprobe build/attnprobe] [--work /tmp/hostile] [--quick] [--groups all|48]

Every case says which exit codes are right (0 ok, 1 gate failed, 2 usage, 3 input). A result is
  clean   an expected non-zero code (or 0 where 0 is right),
  wrong   exit 4, or a code outside the expected set that is not 0,
  crash   killed by a signal (or a code > 4 other than the timeout's),
  hang    still running after the time limit,
  silent  exit 0 where the input was bad (a silent wrong result).
Prints one line per group and the cases that were not clean; exits 1 if any was not clean.
Needs Debian's python3-h5py and python3-numpy.
"""
import argparse
import csv
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

TIMEOUT = 60
GROUPS = {}


def run(cmd, timeout=TIMEOUT):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return None, "(timeout)"


def record(group, name, cmd, expected, timeout=TIMEOUT):
    code, out = run(cmd, timeout)
    if code is None:
        verdict = "hang"
    elif code < 0 or (code > 4 and code != 124):
        verdict = "crash"
    elif code in expected:
        verdict = "clean"
    elif code == 0:
        verdict = "silent"
    else:
        verdict = "wrong"
    GROUPS.setdefault(group, []).append((name, verdict, code, out.strip().splitlines()[-1:] if out else []))
    return code, out


# ---------------------------------------------------------------- dumps
def write_qkv(path, n=32, p=8, pv=None, dtype="f4", attrs=None, value=0.1, group="layer_00", **ds_kwargs):
    pv = pv or p
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        g = f.create_group(group)
        for key, width in (("q", p), ("k", p), ("v", pv)):
            g.create_dataset(key, data=(value * rng.standard_normal((1, 2, n, width))).astype(dtype), **ds_kwargs)
        for k, v in (attrs or {}).items():
            g.attrs[k] = v


def structured_dumps(work):
    """(name, path, expected codes): files that are wrong in a known way (all exit 3), and sound ones (0)."""
    d = os.path.join(work, "dumps")
    os.makedirs(d, exist_ok=True)
    cases = []

    def add(case, expected=(3,), **kw):
        path = os.path.join(d, case + ".h5")
        write_qkv(path, **kw)
        cases.append((case, path, expected))

    add("sound", expected=(0,))
    add("sound-f16", expected=(0,), dtype="f2")
    add("sound-gzip", expected=(0,), compression="gzip")
    add("scale-string", attrs={"scale": "0.5"})
    add("scale-array", attrs={"scale": np.array([0.5, 0.5])})
    add("scale-1e300", attrs={"scale": 1e300})
    add("scale-neg", attrs={"scale": -1.0})
    add("scale-nan", attrs={"scale": np.nan})
    add("scale-int", expected=(0,), attrs={"scale": 1})
    add("causal-nan", attrs={"causal": np.nan})
    add("causal-half", attrs={"causal": 0.5})
    add("causal-string", attrs={"causal": "yes"})
    add("causal-1", expected=(0,), attrs={"causal": 1})
    add("values-1e200", dtype="f8", value=1e200)
    add("values-1e30-f8", dtype="f8", value=1e30)
    add("layer-huge", group="layer_99999999999")
    # One token of two heads reads as more heads than tokens (a [B, N, H, P] file under the default layout?): refused
    # with the fix; two tokens of two heads are plausible.
    for n, p, expected in ((1, 1, (3,)), (2, 1, (0,))):
        add(f"tiny-n{n}-p{p}", expected=expected, n=n, p=p)
    # Two groups that name one layer.
    path = os.path.join(d, "layer-twice.h5")
    write_qkv(path)
    with h5py.File(path, "a") as f:
        f.copy("layer_00", "layer_0")
    cases.append(("layer-twice", path, (3,)))
    # Declared sizes that were never written (a few KB).
    for name, shape in (("declared-n1e7", (10**7, 4)), ("declared-n1e9", (10**9, 4)), ("declared-p1e9", (4, 10**9)),
                        ("declared-bh1e6", (10**6, 10**6, 2, 2))):
        path = os.path.join(d, name + ".h5")
        with h5py.File(path, "w") as f:
            g = f.create_group("layer_00")
            for key in "qkv":
                g.create_dataset(key, shape=shape, dtype="f4", chunks=tuple([1] * (len(shape) - 1) + [min(shape[-1], 4)]))
        cases.append((name, path, (3,)))
    # A virtual dataset without its source; external storage shorter than the dataset.
    path = os.path.join(d, "virtual-missing.h5")
    write_qkv(path)
    with h5py.File(path, "a") as f:
        del f["layer_00/v"]
        layout = h5py.VirtualLayout(shape=(1, 2, 32, 8), dtype="f4")
        layout[:] = h5py.VirtualSource(os.path.join(d, "absent.h5"), "v", shape=(1, 2, 32, 8))
        f["layer_00"].create_virtual_dataset("v", layout)
    cases.append(("virtual-missing", path, (3,)))
    path = os.path.join(d, "external-short.h5")
    raw = os.path.join(d, "external-short.raw")
    with open(raw, "wb") as f:
        f.write(b"\0" * 10)
    write_qkv(path)
    with h5py.File(path, "a") as f:
        del f["layer_00/v"]
        f["layer_00"].create_dataset("v", shape=(1, 2, 32, 8), dtype="f4", external=[(raw, 0, h5py.h5f.UNLIMITED)])
    with open(raw, "wb") as f:
        f.write(b"\0" * 10)
    cases.append(("external-short", path, (3,)))
    # Not a dump at all.
    os.makedirs(os.path.join(d, "a-directory.h5"), exist_ok=True)
    cases.append(("directory", os.path.join(d, "a-directory.h5"), (3,)))
    empty = os.path.join(d, "empty.h5")
    open(empty, "wb").close()
    cases.append(("empty", empty, (3,)))
    # A safetensors header whose only fault is 200000 nested arrays beside a tensor's fields: printing it
    # in a message overflowed the stack.
    deep = os.path.join(d, "deep.safetensors")
    data = np.zeros((1, 1, 4, 2), dtype="<f4").tobytes()
    entries = ",".join(f'"layer_00.{t}":{{"dtype":"F32","shape":[1,1,4,2],"data_offsets":[{i * 32},{i * 32 + 32}]'
                       + (',"extra":' + "[" * 200000 + "]" * 200000 if t == "q" else "") + "}"
                       for i, t in enumerate("qkv"))
    header = ("{" + entries + "}").encode()
    with open(deep, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + data * 3)
    cases.append(("deep safetensors header", deep, (3,)))
    return cases


def mutated_dumps(work, count, seed=12):
    """Byte-level damage of a sound dump: flips, zeroed runs, truncation. Any of 0 or 3 is clean;
    exit 0 is accepted because a flipped byte may hit padding or a value that stays valid."""
    d = os.path.join(work, "mutants")
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, "base.h5")
    write_qkv(base, n=24, p=4)
    data = open(base, "rb").read()
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        b = bytearray(data)
        kind = i % 4
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            start = rng.randrange(len(b))
            for j in range(start, min(len(b), start + rng.randint(1, 64))):
                b[j] = rng.choice((0, 0xFF))
        elif kind == 2:
            b = b[: rng.randrange(len(b))]
        else:
            pos = rng.randrange(min(len(b), 2048))  # the superblock and object headers
            b[pos] = rng.randrange(256)
        path = os.path.join(d, f"m{i:03d}.h5")
        open(path, "wb").write(bytes(b))
        cases.append((f"mutant-{i}", path, (0, 3)))
    return cases


def dump_commands(exe, path, out):
    return [("info", [exe, "info", path]),
            ("eval", [exe, "eval", path, "-e", "softmax", "-e", "vmean", "-e", "yoso(m=4)", "--trials", "2"]),
            ("sweep", [exe, "sweep", path, "-e", "softmax", "-e", "vmean", "-q", "--overwrite", "-o", out])]


# ---------------------------------------------------------------- options and specs
def option_cases(exe, dump, work):
    out = os.path.join(work, "opt.csv")
    sweep = [exe, "sweep", dump, "-q", "--overwrite", "-o", out]
    bad = [  # (args, expected)
        (["--threads", "100000", "-e", "vmean"], (2,)), (["--threads", "-1", "-e", "vmean"], (2,)),
        (["--lengths", "1..4611686018427387904:x2", "-e", "vmean", "--dry-run"], (2, 3)),
        (["--lengths", "1..4611686018427387904:x2", "-e", "vmean"], (2, 3)),
        (["--lengths", "0..9223372036854775807", "-e", "vmean"], (2,)),
        (["--lengths", "9223372036854775807..9223372036854775807:+9", "-e", "vmean"], (2, 3)),
        (["--lengths", "99999999999999999999", "-e", "vmean"], (2,)),
        (["--lengths", "", "-e", "vmean"], (0, 2)),  # empty: the default (full length) (["--lengths", ",", "-e", "vmean"], (2,)),
        (["--lengths", "8..4", "-e", "vmean"], (2,)), (["--lengths", "1..8:x1", "-e", "vmean"], (2,)),
        (["--lengths", "1..8:+0", "-e", "vmean"], (2,)), (["--lengths", "1..8:y2", "-e", "vmean"], (2,)),
        (["--lengths", "-4", "-e", "vmean"], (2,)), (["--lengths", "0", "-e", "vmean"], (2,)),
        (["--lengths", "100000", "-e", "vmean"], (3,)),
        (["--trials", "1000000000", "-e", "yoso(m=4)"], (2,)),
        (["--trials", "1000000000", "-e", "yoso(m=4)", "--dry-run"], (2,)),
        (["--trials", "0", "-e", "vmean"], (2,)), (["--trials", "1e99", "-e", "vmean"], (2,)),
        (["--seed", "-1", "-e", "vmean"], (2,)), (["--seed", "18446744073709551616", "-e", "vmean"], (2,)),
        (["--seed", "abc", "-e", "vmean"], (2,)),
        (["--samples", "0", "-e", "yoso"], (2,)), (["--samples", "99999999999", "-e", "yoso"], (2,)),
        (["--samples", "1..4611686018427387904:x2", "-e", "yoso"], (2,)),
        (["--layers", "7", "-e", "vmean"], (3,)), (["--layers", "99999999999", "-e", "vmean"], (3,)),
        (["--heads", "-1", "-e", "vmean"], (2,)), (["--batch", "4294967296", "-e", "vmean"], (3,)),
        (["--metrics", "spec_rell", "-e", "vmean"], (2,)), (["--metrics", "", "-e", "vmean"], (2,)),
        (["--reference", "yoso", "-e", "vmean"], (2,)), (["--reference", "nope", "-e", "vmean"], (2,)),
        (["--device", "tpu", "-e", "vmean"], (2,)), (["--max-memory", "lots", "-e", "vmean"], (2,)),
        (["--max-memory", "1K", "-e", "vmean"], (3,)), (["--max-memory", "0", "-e", "vmean"], (2,)),
        (["--layout", "xyz", "-e", "vmean"], (2,)), (["--num-heads", "3", "-e", "vmean"], (2,)),
        (["--q-path", "/a", "-e", "vmean"], (2,)),
        (["--resume", "--overwrite", "-e", "vmean"], (2,)),
    ]
    specs = ["", "(", ")", "yoso(", "yoso)", "yoso(m=)", "yoso(=4)", "yoso(m=4", "yoso(m=4,)", "yoso(m=4,m=8)",
             "yoso(m=-1)", "yoso(m=0)", "yoso(m=1e9)", "yoso(m=99999999999999999999)", "yoso(m=4.5)",
             "yoso(tau=64)", "yoso(m=65536,tau=30)", "yoso(hash=nope)", "yoso(nope=1)", "nope", "YOSO",
             "performer(M=1048576)", "linformer(d=1048576)", "lara(beta=nan)", "lara(beta=inf)", "lara(beta=-0)",
             "lara(beta=1e400)", "softmax(x=1)", "vmean()", "yoso(m=4)(m=8)", "yoso(m=4))", "yoso m=4",
             "yoso(m=\u00e94)", "yoso(m=4\u0000)", "a" * 10000, "yoso(" + "m=4," * 1000 + ")"]
    spec_expected = {"vmean()": (0, 2), "lara(beta=-0)": (0, 2), "performer(M=1048576)": (0, 3),
                     "linformer(d=1048576)": (0, 3), "yoso(m=65536,tau=30)": (0, 3)}
    cases = [(" ".join(a), sweep + a, e) for a, e in bad]
    for s in specs:
        if "\u0000" in s:
            continue  # argv cannot carry NUL
        cases.append((f"spec {s[:40]!r}", sweep + ["-e", s, "--lengths", "64", "--trials", "1", "--max-memory", "2G"],
                      spec_expected.get(s, (2,))))
    lists = ["0,1", "all", "0..0", "1..0", "x", "0..99999999999", "0,0,0", " 0 ", "0:+1", "..", "0..", "..1"]
    for l in lists:
        for opt in ("--layers", "--heads", "--batch"):
            cases.append((f"{opt} {l!r}", sweep + ["-e", "vmean", opt, l, "--lengths", "16"], (0, 2, 3)))
    return cases


# ---------------------------------------------------------------- check
def check_cases(exe, dump, work):
    d = os.path.join(work, "check")
    os.makedirs(d, exist_ok=True)
    good = os.path.join(d, "good.csv")
    subprocess.run([exe, "sweep", dump, "-e", "yoso(m=4)", "-e", "vmean", "--lengths", "16,32", "--trials", "4",
                    "-q", "--overwrite", "-o", good], check=True, stdout=subprocess.DEVNULL)
    summ = os.path.join(d, "summary.csv")
    subprocess.run([exe, "summarize", good, "-o", summ], check=True, stdout=subprocess.DEVNULL)
    tlines = open(good).read().splitlines(True)
    slines = open(summ).read().splitlines(True)
    cases = []

    def file(name, lines):
        path = os.path.join(d, name)
        open(path, "w").write("".join(lines))
        return path

    def edit(lines, i, changes):  # specs hold commas: fields are split and joined as CSV
        cols = lines[0].strip().split(",")
        f = next(csv.reader([lines[i]]))
        for k, v in changes.items():
            f[cols.index(k)] = v(f[cols.index(k)]) if callable(v) else v
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerow(f)
        return out.getvalue()

    def srow(i, **changes):
        return edit(slines, i, changes)

    def trow(i, **changes):
        return edit(tlines, i, changes)

    bad_summaries = {
        "header-only": [slines[0]], "mean-nan": [slines[0], srow(1, mean="nan")] + slines[2:],
        "mean-inf": [slines[0], srow(1, mean="inf")] + slines[2:],
        "mean-neginf": [slines[0], srow(1, mean="-inf")] + slines[2:],
        "mean-neg": [slines[0], srow(1, mean="-0.5")] + slines[2:],
        "count-0": [slines[0], srow(1, count="0")] + slines[2:],
        "count-neg": [slines[0], srow(1, count="-3")] + slines[2:],
        "stderr-neg": [slines[0], srow(1, stderr="-0.1")] + slines[2:],
        "stderr-nan": [slines[0], srow(1, stderr="nan")] + slines[2:],
        "std-neg": [slines[0], srow(1, std="-1")] + slines[2:],
        "dup-row": slines + [slines[1]], "no-newline": slines[:-1] + [slines[-1].rstrip("\n")],
        "short-row": [slines[0], ",".join(slines[1].split(",")[:-2]) + "\n"] + slines[2:],
        "long-row": [slines[0], slines[1].rstrip("\n") + ",9\n"] + slines[2:],
        "bad-quote": [slines[0], '"' + slines[1]] + slines[2:],
        "bad-header": ["dump,x\n"] + slines[1:], "empty": [], "binary": ["\0\1\2\3\n"],
        "crlf": [l.rstrip("\n") + "\r\n" for l in slines[:1]] + [l.replace("\n", "\r\n") for l in slines[1:]],
        "layer-neg": [slines[0], srow(1, layer="-1")] + slines[2:],
        "n-huge": [slines[0], srow(1, n="99999999999999999999")] + slines[2:],
        "mean-text": [slines[0], srow(1, mean="abc")] + slines[2:],
        "mean-hex": [slines[0], srow(1, mean="0x1p3")] + slines[2:],
    }
    ok_as_new_only = {"crlf"}  # a CRLF file is a valid CSV
    for name, lines in bad_summaries.items():
        path = file("s-" + name + ".csv", lines)
        exp = (0,) if name in ok_as_new_only else (3,)
        cases.append((f"baseline {name}", [exe, "check", good, "--baseline", path], exp))
        if name == "mean-nan":
            exp = (1,)  # a new mean that became NaN is a regression (exit 1), by design; an infinite one is refused
        cases.append((f"new {name}", [exe, "check", path, "--baseline", summ], exp))
        # `report` reads its run and baseline as the gate does: a page of a NaN or +inf mean is drawn (exit 0).
        page = os.path.join(d, "report.html")
        cases.append((f"report baseline {name}", [exe, "report", good, path, "-o", page],
                      (0,) if name in ok_as_new_only else (3,)))
        cases.append((f"report run {name}", [exe, "report", path, "-o", page], (0,) if exp != (3,) else (3,)))
    bad_trials = {
        "value-neg": [tlines[0], trow(1, value="-1")] + tlines[2:],
        "value-neginf": [tlines[0], trow(1, value="-inf")] + tlines[2:],
        "dup": tlines + [tlines[1]], "no-newline": tlines[:-1] + [tlines[-1].rstrip("\n")],
        "seed-neg": [tlines[0], trow(1, seed="-1")] + tlines[2:],
        "seed-big": [tlines[0], trow(1, seed="18446744073709551616")] + tlines[2:],
        "trial-neg": [tlines[0], trow(1, trial="-1")] + tlines[2:],
        "metric-unknown": [tlines[0], trow(1, metric="nope")] + tlines[2:],
    }
    for name, lines in bad_trials.items():
        path = file("t-" + name + ".csv", lines)
        cases.append((f"trials new {name}", [exe, "check", path, "--baseline", good], (3,)))
        cases.append((f"trials baseline {name}", [exe, "check", good, "--baseline", path], (3,)))
        cases.append((f"report trials {name}", [exe, "report", path, "-o", os.path.join(d, "report.html")], (3,)))
    worse = file("worse.csv", [tlines[0]] + [trow(i, value=lambda v: repr(float(v) * 1.5 + 1e-3))
                                           for i in range(1, len(tlines))])
    cases.append(("1.5x worse", [exe, "check", worse, "--baseline", good], (1,)))
    for opt, val in (("--z", "nan"), ("--z", "inf"), ("--z", "-1"), ("--rtol", "nan"), ("--rtol", "inf"),
                     ("--atol", "-inf"), ("--atol", "nan"), ("--metrics", "spec_rell"), ("--metrics", ","),
                     ("--metrics", "")):
        cases.append((f"{opt} {val}", [exe, "check", worse, "--baseline", good, opt, val], (2,)))
    cases.append(("same", [exe, "check", good, "--baseline", good], (0,)))
    cases.append(("missing file", [exe, "check", os.path.join(d, "nope.csv"), "--baseline", good], (3,)))
    cases.append(("directory", [exe, "check", d, "--baseline", good], (3,)))
    cases.append(("json to a dir", [exe, "check", good, "--baseline", good, "--json", d], (3,)))
    return cases


# ---------------------------------------------------------------- outputs
def output_cases(exe, dump, work):
    d = os.path.join(work, "outputs")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    plain = os.path.join(d, "plain")
    open(plain, "w").write("x")
    os.makedirs(os.path.join(d, "dir.csv"))
    os.makedirs(os.path.join(d, "blocked", "out.csv.run.json", "x"))
    sweep = [exe, "sweep", dump, "-e", "vmean", "--lengths", "16", "-q", "-o"]
    cases = [("under a file", sweep + [plain + "/x.csv"], (3,)), ("a directory", sweep + [os.path.join(d, "dir.csv")], (3,)),
             ("/dev/full", sweep + ["/dev/full"], (3,)),
             ("run.json blocked", sweep + [os.path.join(d, "blocked", "out.csv")], (3,)),
             ("/proc", sweep + ["/proc/x.csv"], (3,)), ("empty name", sweep + [""], (2, 3)),
             ("eval -o under a file", [exe, "eval", dump, "-e", "vmean", "-o", plain + "/x.csv"], (3,)),
             ("summarize -o dir", [exe, "summarize", os.path.join(work, "check", "good.csv"), "-o", d], (3,)),
             ("synth under a file", [exe, "synth", "-o", plain + "/x.h5"], (2, 3))]
    # Whole-file outputs into a device that refuses the bytes: they reported success and, as root,
    # replaced the device node (device_check below looks at it afterwards); synth on a full disk crashed.
    summ = os.path.join(work, "check", "good.csv")
    cases += [("summarize -o /dev/full", [exe, "summarize", summ, "-o", "/dev/full"], (3,)),
              ("eval -o /dev/full", [exe, "eval", dump, "-e", "vmean", "--length", "16", "-o", "/dev/full"], (3,)),
              ("synth -o /dev/full", [exe, "synth", "-o", "/dev/full", "--tokens", "16"], (3,)),
              ("bench --csv /dev/full", [exe, "bench", "-e", "vmean", "--lengths", "16", "--repeat", "1", "--no-sgemm",
                                         "--csv", "/dev/full"], (3,)),
              ("synth, disk full", ["sh", "-c", f"ulimit -f 2; trap '' XFSZ; exec {exe} synth -o {d}/limited.h5"],
               (3,))]
    return cases


def device_check():
    """/dev/null and /dev/full are still character devices (a rename over them replaced them)."""
    import stat
    return all(stat.S_ISCHR(os.stat(p).st_mode) for p in ("/dev/null", "/dev/full") if os.path.exists(p))


def leftover_check(work):
    blocked = os.path.join(work, "outputs", "blocked")
    return sorted(os.listdir(blocked)) == ["out.csv.run.json"]


# ---------------------------------------------------------------- concurrency and kills
def concurrency_cases(exe, dump, work, rounds):
    """A second writer while the first runs, and SIGKILL/SIGINT/SIGTERM at random moments then
    --resume: the resumed CSV must equal a clean run's (same rows, no duplicates)."""
    d = os.path.join(work, "conc")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    grid = ["-e", "yoso(m=32)", "-e", "performer(M=64)", "--lengths", "64,128,256", "--trials", "200", "-q",
            "--threads", "1"]
    clean = os.path.join(d, "clean.csv")
    subprocess.run([exe, "sweep", dump] + grid + ["-o", clean], check=True)
    reference = sorted(open(clean).read().splitlines())
    rng = random.Random(5)
    out = []
    for i in range(rounds):
        path = os.path.join(d, f"r{i}.csv")
        first = subprocess.Popen([exe, "sweep", dump] + grid + ["-o", path], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        time.sleep(0.05 + rng.random() * 0.3)
        code, text = run([exe, "sweep", dump] + grid + ["-o", path, "--resume"])
        still_running = first.poll() is None
        verdict_code = code if still_running else 3  # the first finished too early to test
        out.append((f"second writer {i}", code, text, still_running))
        sig = rng.choice([signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
        signalled = first.poll() is None
        if signalled:
            first.send_signal(sig)
        first_code = first.wait()
        # SIGINT/SIGTERM ask the sweep to stop: it writes its finished trials and exits 130.
        stopped_right = not signalled or sig == signal.SIGKILL or first_code == 130
        code2, text2 = run([exe, "sweep", dump] + grid + ["-o", path, "--resume"])
        same = code2 == 0 and sorted(open(path).read().splitlines()) == reference
        GROUPS.setdefault("kills+resume", []).append(
            (f"round {i} {sig.name} (first exit {first_code})",
             "clean" if same and stopped_right else ("silent" if code2 == 0 else "wrong"), code2,
             text2.strip().splitlines()[-1:]))
        GROUPS.setdefault("concurrent writers", []).append(
            (f"round {i} ({'overlapped' if still_running else 'the first had finished: nothing to refuse'})", "clean" if (not still_running or (code == 3 and "in use by process" in text)) else
             ("silent" if code == 0 else "wrong"), code, text.strip().splitlines()[-1:]))
    return out


# ---------------------------------------------------------------- issue 48's classes
def summary_with(path, summary_lines, **fields):
    """summary_lines (header, one row) with the named columns of the row replaced (median/min/max follow mean)."""
    header = summary_lines[0].rstrip("\n").split(",")
    row = next(csv.reader([summary_lines[1]]))
    for column, value in fields.items():
        targets = ["mean", "median", "min", "max"] if column == "mean" else [column]
        for target in targets:
            row[header.index(target)] = value
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(row)
    open(path, "w").write(summary_lines[0] + buffer.getvalue())
    return path


def gate_number_cases(exe, work):
    """check fails closed on statistics the gate cannot hold to: before, each new run here passed."""
    d = os.path.join(work, "gate-numbers")
    os.makedirs(d, exist_ok=True)
    lines = open(os.path.join(work, "check", "summary.csv")).read().splitlines(True)[:2]
    base = summary_with(os.path.join(d, "base.csv"), lines)
    cases = []
    for name, fields in [("se inf", dict(mean="0.9", std="inf", stderr="inf")),
                         ("se 1e200", dict(mean="0.9", std="1e200", stderr="1e200")),
                         ("se 1e155", dict(mean="0.9", std="1e155", stderr="1e155")),
                         ("mean 1e200", dict(mean="1e200")), ("mean inf", dict(mean="inf", std="0", stderr="0")),
                         ("se 1e9 x mean", dict(mean="0.9", std="9e8", stderr="9e8"))]:
        path = summary_with(os.path.join(d, name.replace(" ", "_") + ".csv"), lines, **fields)
        cases.append((f"new run {name}", [exe, "check", path, "--baseline", base], (3,)))
        cases.append((f"baseline {name}", [exe, "check", base, "--baseline", path], (3,)))
    trials = open(os.path.join(work, "check", "good.csv")).read().splitlines(True)
    header = trials[0].rstrip("\n").split(",")
    row = next(csv.reader([trials[1]]))
    row[header.index("value")] = "1e300"
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(row)
    huge = os.path.join(d, "trial-1e300.csv")
    open(huge, "w").write("".join(trials[:1]) + buffer.getvalue() + "".join(trials[2:]))
    cases.append(("a trial value 1e300", [exe, "check", huge, "--baseline", os.path.join(work, "check", "good.csv")],
                  (3,)))
    cases.append(("--z 1e308", [exe, "check", base, "--baseline", base, "--z", "1e308"], (2,)))
    cases.append(("--rtol 1e300", [exe, "check", base, "--baseline", base, "--rtol", "1e300"], (2,)))
    return cases


def clobber_cases(exe, dump, work):
    """Outputs naming an input, under its own name and through aliases: each must be refused (exit 2) and
    leave the input as it was (checked after the group by unchanged_inputs)."""
    d = os.path.join(work, "clobber")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    mine = os.path.join(d, "mine.h5")
    shutil.copy(dump, mine)
    os.symlink(mine, os.path.join(d, "link.h5"))
    os.link(mine, os.path.join(d, "hard.h5"))
    alias = os.path.join(d, ".", "mine.h5")
    rows = os.path.join(d, "rows.csv")
    subprocess.run([exe, "eval", mine, "-e", "vmean", "--length", "16", "-o", rows], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = os.path.join(d, "summary.csv")
    subprocess.run([exe, "summarize", rows, "-o", summary], check=True, stdout=subprocess.DEVNULL)
    shard = os.path.join(d, "shard.csv")
    subprocess.run([exe, "sweep", mine, "-e", "vmean", "--lengths", "16", "-q", "--shard", "0/1", "-o", shard],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # run.json: NAME.csv.run.json (NAME.run.json from versions before issue 48, for a before/after table).
    shard_info = shard + ".run.json" if os.path.exists(shard + ".run.json") else os.path.join(d, "shard.run.json")
    cases = [
        ("eval -o the dump", [exe, "eval", mine, "-e", "vmean", "--length", "16", "-o", mine], (2,)),
        ("eval -o ./dump", [exe, "eval", mine, "-e", "vmean", "--length", "16", "-o", alias], (2,)),
        ("eval -o a symlink to the dump", [exe, "eval", mine, "-e", "vmean", "--length", "16", "-o",
                                           os.path.join(d, "link.h5")], (2,)),
        ("eval -o a hard link to the dump", [exe, "eval", mine, "-e", "vmean", "--length", "16", "-o",
                                             os.path.join(d, "hard.h5")], (2,)),
        ("diagnose -o the dump", [exe, "diagnose", mine, "-o", alias], (2,)),
        ("sweep --overwrite -o the dump", [exe, "sweep", mine, "-e", "vmean", "--lengths", "16", "-q", "--overwrite",
                                           "-o", alias], (2,)),
        ("summarize X -o X", [exe, "summarize", rows, "-o", rows], (2,)),
        ("summarize -o a second input", [exe, "summarize", rows, summary, "-o", summary], (2,)),
        ("check --json the baseline", [exe, "check", rows, "--baseline", summary, "--json", summary], (2,)),
        ("check --json the new run", [exe, "check", rows, "--baseline", summary, "--json", rows], (2,)),
        ("merge -o the shard's run.json", [exe, "merge", shard, "--overwrite", "-o", shard_info], (2,)),
    ]
    return cases, {p: open(p, "rb").read() for p in (mine, rows, summary, shard, shard_info)}


def unchanged_inputs(before):
    return [path for path, data in before.items() if open(path, "rb").read() != data]


def run_json_clash(exe, dump, work):
    """-o x.tsv beside x.csv: each output keeps its own run.json (before, both were x.run.json)."""
    d = os.path.join(work, "clobber")
    x_csv, x_tsv = os.path.join(d, "x.csv"), os.path.join(d, "x.tsv")
    subprocess.run([exe, "sweep", dump, "-e", "vmean", "--lengths", "16", "-q", "-o", x_csv], check=True,
                   stderr=subprocess.DEVNULL)
    subprocess.run([exe, "sweep", dump, "-e", "softmax", "--lengths", "16", "-q", "-o", x_tsv], check=True,
                   stderr=subprocess.DEVNULL)
    code, _ = run([exe, "sweep", dump, "-e", "vmean", "--lengths", "16", "-q", "--resume", "-o", x_csv])
    return code == 0


def resume_cases(exe, work):
    """--resume against a regenerated dump (same name and shapes, other values), another device, and, without
    run.json, other --trials or --metrics: each refused (exit 2), the file untouched."""
    d = os.path.join(work, "resume-inputs")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    dump = os.path.join(d, "model.h5")
    synth = [exe, "synth", "-o", dump, "--layers", "1", "--heads", "2", "--batch", "1", "--tokens", "64", "--dim", "8"]
    subprocess.run(synth + ["--seed", "1"], check=True, stderr=subprocess.DEVNULL)
    out = os.path.join(d, "sweep.csv")
    grid = ["-e", "performer(M=8)", "--lengths", "32,64", "--trials", "2", "-q", "-o", out]
    subprocess.run([exe, "sweep", dump] + grid, check=True, stderr=subprocess.DEVNULL)
    lines = open(out).read().splitlines(True)
    cut = "".join(lines[:len(lines) // 2])
    # A generator: each case runs (in the caller) before the next one changes the files.
    subprocess.run(synth + ["--seed", "2"], check=True, stderr=subprocess.DEVNULL)
    open(out, "w").write(cut)
    yield "a regenerated dump", [exe, "sweep", dump] + grid + ["--resume"], (2,), out, cut
    subprocess.run(synth + ["--seed", "1"], check=True, stderr=subprocess.DEVNULL)
    for info in (out + ".run.json", os.path.join(d, "sweep.run.json")):
        if os.path.exists(info):
            os.remove(info)
    open(out, "w").write(cut)
    fewer = ["-e", "performer(M=8)", "--lengths", "32,64", "--trials", "1", "-q", "-o", out]
    yield "no run.json, fewer --trials", [exe, "sweep", dump] + fewer + ["--resume"], (2,), out, cut
    yield "no run.json, other --metrics", [exe, "sweep", dump] + grid + ["--metrics", "spec_rel", "--resume"], (2,), \
        out, cut


def write_npz_bomb(path, tokens=1 << 21, dim=16):
    """An .npz whose deflated q, k and v inflate to 128 MiB each (zeros compress ~1000:1)."""
    import zipfile
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, %d, %d), }" % (tokens, dim)
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    preamble = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    chunk = bytes(1 << 20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name in ("layer_00.q", "layer_00.k", "layer_00.v"):
            with z.open(name + ".npy", "w", force_zip64=True) as f:
                f.write(preamble)
                for _ in range(tokens * dim * 4 // len(chunk)):
                    f.write(chunk)


def cost_cases(exe, dump, work):
    """Work that scaled badly before any check: each must end (in its time limit) with its error or result."""
    d = os.path.join(work, "costs")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    many = os.path.join(d, "many.safetensors")
    entries = {f"junk.{i:06d}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(40000)}
    data = np.arange(24, dtype="<f4") / 24
    for i, t in enumerate("qkv"):
        entries[f"layer_00.{t}"] = {"dtype": "F32", "shape": [4, 2], "data_offsets": [32 * i, 32 * i + 32]}
    import json
    text = json.dumps(entries).encode()
    open(many, "wb").write(len(text).to_bytes(8, "little") + text + data.tobytes())
    bomb = os.path.join(d, "bomb.npz")
    write_npz_bomb(bomb)
    return [
        ("--lengths 1..1000000 on a 256-token dump", [exe, "sweep", dump, "-e", "vmean", "--lengths", "1..1000000",
                                                     "-q", "-o", os.path.join(d, "x.csv")], (3,), 10),
        ("--heads 0..999999", [exe, "sweep", dump, "-e", "vmean", "--heads", "0..999999", "-q", "-o",
                               os.path.join(d, "y.csv")], (3,), 10),
        ("safetensors header of 40000 tensors", [exe, "info", many], (0,), 10),
        (".npz inflating to 384 MiB under --max-memory 64M", [exe, "eval", bomb, "-e", "vmean", "--length", "16",
                                                              "--max-memory", "64M"], (3,), 60),
    ]


def ambiguity_cases(exe, dump, work):
    d = os.path.join(work, "ambiguous")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    q = '"layer_00.q":{"dtype":"F32","shape":[4,2],"data_offsets":[0,32]},'
    kv = ('"layer_00.k":{"dtype":"F32","shape":[4,2],"data_offsets":[32,64]},'
          '"layer_00.v":{"dtype":"F32","shape":[4,2],"data_offsets":[64,96]}')
    data = (0.5 + np.arange(24, dtype="<f4") / 8).tobytes()

    def st(name, header):
        path = os.path.join(d, name)
        raw = header.encode()
        open(path, "wb").write(len(raw).to_bytes(8, "little") + raw + data)
        return path
    cases = [
        ("safetensors tensor named twice", [exe, "info", st("t.safetensors", "{" + q + q + kv + "}")], (3,)),
        ("safetensors metadata key twice", [exe, "info", st("m.safetensors", '{"__metadata__":{"layer_00.scale":"0.5",'
                                                            '"layer_00.scale":"2"},' + q + kv + "}")], (3,)),
        ("safetensors __metadata__ twice", [exe, "info", st("mm.safetensors", '{"__metadata__":{"a":"1"},'
                                                            '"__metadata__":{"b":"2"},' + q + kv + "}")], (3,)),
    ]
    for args in (["--temperatures", "1e-300"], ["--temperatures", "1e-12", "--dtype", "float16"],
                 ["--spread", "inf"], ["--spread", "nan"]):
        cases.append((f"synth {' '.join(args)}", [exe, "synth", "-o", os.path.join(d, "s.h5"), "--tokens", "8"] + args,
                      (2,)))
    return cases


def name_round_trip(exe, dump, work):
    """A dump named with a newline, quotes, a comma, a backslash or a byte that is not UTF-8: eval writes
    a CSV that summarize reads back, one row per line."""
    d = os.path.join(work, "ambiguous")
    failures = []
    for name in ("a\nb.h5", 'q"uo,te.h5', "back\\slash.h5", "bad\udcff.h5"):
        path = os.path.join(d, name)
        shutil.copy(dump, path)
        out = os.path.join(d, "named.csv")
        code, text = run([exe, "eval", path, "-e", "vmean", "--length", "16", "-q", "-o", out])
        rows = open(out, "rb").read().count(b"\n") - 1 if code == 0 else -1
        code2, _ = run([exe, "summarize", out]) if code == 0 else (None, "")
        if code != 0 or code2 != 0 or rows != len(open(out, "rb").read().splitlines()) - 1 or rows < 1:
            failures.append(repr(name))
        os.remove(path)
    return failures


def pipe_check(exe):
    """The exit status of a command whose reader closed the pipe: 3 (before: killed by SIGPIPE)."""
    p = subprocess.run(["bash", "-c", f"'{exe}' list --full | true; echo ${{PIPESTATUS[0]}}"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL)
    return p.stdout.decode().strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnprobe", default=os.path.join(os.path.dirname(__file__), "..", "build", "attnprobe"))
    ap.add_argument("--work", default="/tmp/attnprobe-hostile")
    ap.add_argument("--quick", action="store_true", help="fewer mutants and kill rounds")
    ap.add_argument("--groups", choices=("all", "48"), default="all",
                    help="48: only the classes of issue 48 (gate numbers, outputs over inputs, resume inputs, costs, "
                         "ambiguity)")
    args = ap.parse_args()
    exe = os.path.abspath(args.attnprobe)
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    demo = os.path.join(work, "demo.h5")
    subprocess.run([exe, "synth", "-o", demo, "--layers", "1", "--heads", "2", "--batch", "1", "--tokens", "256", "--dim",
                    "16"], check=True, stdout=subprocess.DEVNULL)

    if args.groups == "48":
        # check_cases' good.csv and summary.csv are the gate-number cases' starting point.
        check_cases(exe, demo, work)
        issue48(exe, demo, work)
        return report()
    dumps = structured_dumps(work) + mutated_dumps(work, 40 if args.quick else 120)
    for name, path, expected in dumps:
        for cmd_name, cmd in dump_commands(exe, path, os.path.join(work, "dump-out.csv")):
            record("dumps x 3 commands", f"{name} {cmd_name}", cmd, expected)
    for name, cmd, expected in option_cases(exe, demo, work):
        record("options and specs", name, cmd, expected)
    for name, cmd, expected in check_cases(exe, demo, work):
        record("check CSVs and options", name, cmd, expected)
    for name, cmd, expected in output_cases(exe, demo, work):
        record("outputs", name, cmd, expected)
    GROUPS["outputs"].append(("nothing left beside a blocked run.json", "clean" if leftover_check(work) else "silent",
                              None, []))
    GROUPS["outputs"].append(("/dev/null and /dev/full still devices", "clean" if device_check() else "silent",
                              None, []))
    issue48(exe, demo, work)
    concurrency_cases(exe, demo, work, 4 if args.quick else 12)
    return report()


def issue48(exe, demo, work):
    for name, cmd, expected in gate_number_cases(exe, work):
        record("gate: numbers", name, cmd, expected)
    cases, before = clobber_cases(exe, demo, work)
    for name, cmd, expected in cases:
        record("outputs over inputs", name, cmd, expected)
    changed = unchanged_inputs(before)
    GROUPS["outputs over inputs"].append(("every input unchanged afterwards", "silent" if changed else "clean", None,
                                          [f"changed: {', '.join(changed)}"] if changed else []))
    GROUPS["outputs over inputs"].append(("x.csv and x.tsv keep their own run.json",
                                          "clean" if run_json_clash(exe, demo, work) else "silent", None, []))
    for name, cmd, expected, out, cut in resume_cases(exe, work):
        code, text = record("resume knows its inputs", name, cmd, expected)
        if code in expected and open(out).read() != cut:
            GROUPS["resume knows its inputs"][-1] = (name + " (file changed)", "silent", code, [])
    for name, cmd, expected, limit in cost_cases(exe, demo, work):
        record("costs before checks", name, cmd, expected, timeout=limit)
    for name, cmd, expected in ambiguity_cases(exe, demo, work):
        record("ambiguous input", name, cmd, expected)
    failures = name_round_trip(exe, demo, work)
    GROUPS["ambiguous input"].append(("hostile dump names round-trip through the CSV",
                                      "silent" if failures else "clean", None, failures[:1]))
    status = pipe_check(exe)
    GROUPS["ambiguous input"].append((f"closed pipe: exit {status}", "clean" if status == "3" else
                                      "crash" if status in ("141", "") else "wrong", status, []))


def report():
    bad = 0
    print(f"{'group':28} {'cases':>5} {'clean':>5} {'wrong':>5} {'crash':>5} {'hang':>5} {'silent':>6}")
    for group, results in GROUPS.items():
        counts = {v: sum(1 for r in results if r[1] == v) for v in ("clean", "wrong", "crash", "hang", "silent")}
        print(f"{group:28} {len(results):5} {counts['clean']:5} {counts['wrong']:5} {counts['crash']:5} "
              f"{counts['hang']:5} {counts['silent']:6}")
        bad += len(results) - counts["clean"]
    for group, results in GROUPS.items():
        for name, verdict, code, last in results:
            if verdict != "clean":
                print(f"  {verdict:6} {group}: {name} (exit {code}) {last[0][:160] if last else ''}")
    overlapped = sum(1 for r in GROUPS.get("concurrent writers", []) if "overlapped" in r[0])
    print(f"concurrent writers: the second writer started while the first ran in {overlapped} of "
          f"{len(GROUPS.get('concurrent writers', []))} rounds")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
