"""pytest of the Python package (run by CTest as python_package, see python/tests/run_pytest.py).

What it shows: estimate(case=...) and metrics() reproduce the CLI's sweep bit for bit for every
variant of every registered estimator; sweep()'s DataFrame and CSV equal the CLI's; exact() matches
a numpy softmax; custom Python estimators are measured, summarised and gated like the built-ins, and
their failures name the case; torch tensors work without a copy. Fixed seeds throughout.
"""
import ast
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import attnprobe

SOURCE = os.environ.get("ATTNPROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("ATTNPROBE", os.path.join(SOURCE, "build", "attnprobe"))
DUMP = os.path.join(SOURCE, "data", "synth-demo.h5")

# One slice of the bundled dump for the CLI comparisons (layer 1, head 1, batch item 1, 96 tokens).
SLICE = dict(layers="1", heads="1", batch="1", lengths="96")
SEED = 7


def cli(*args):
    return subprocess.run([BINARY, *args], check=True, capture_output=True, text=True)


def all_variants():
    return [spec for e in attnprobe.estimators() for spec in e["variants"]]


def full_variants():
    return cli("list", "--variants", "--full").stdout.split()


@pytest.fixture(scope="module")
def cli_csv(tmp_path_factory):
    """The CLI's sweeps of every variant of every estimator on SLICE (2 trials each): under the full mask those with
    a full form, under the causal mask the positional ones (sinks and windows, which have none). Those that compress
    a prompt (decode rows only) are test_prompt_estimators_sweep_decode_rows_as_the_cli's."""
    folder = tmp_path_factory.mktemp("cli")
    full = set(full_variants())
    causal = cli("list", "--variants", "--causal").stdout.split()  # the variants with a causal form on all rows
    paths = {}
    for mask, specs in (("full", [s for s in all_variants() if s in full]),
                        ("causal", [s for s in causal if s not in full])):
        paths[mask] = folder / f"{mask}.csv"
        args = ["sweep", DUMP, "--layers", SLICE["layers"], "--heads", SLICE["heads"], "--batch", SLICE["batch"],
                "--lengths", SLICE["lengths"], "--trials", "2", "--seed", str(SEED), "--threads", "2", "--mask", mask,
                "-q", "-o", str(paths[mask])]
        for spec in specs:
            args += ["-e", spec]
        cli(*args)
    return paths


def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


def test_registry_walk_covers_every_estimator():
    # The Python registry is the CLI's: the same estimators, each with the variants the baseline gate runs (those that
    # read a dump's rotary frequencies listed apart, `list --variants --rotary`).
    rotary = set(cli("list", "--variants", "--rotary").stdout.split())
    assert rotary and rotary < set(all_variants())
    assert [s for s in all_variants() if s not in rotary] == cli("list", "--variants").stdout.split()
    assert {e["name"] for e in attnprobe.estimators()} == {attnprobe._core.canonical(s).split("(")[0]
                                                           for s in all_variants()}


def test_estimate_and_metrics_equal_the_cli_bit_for_bit(cli_csv):
    q, k, v, scale, causal = attnprobe.load(DUMP, 1, 1, 1, length=96)
    checked = set()
    for mask, path in cli_csv.items():
        rows = attnprobe.read_csv(path)
        references = {}
        for (spec, ref, trial), group in rows.groupby(["spec", "reference", "trial"], sort=False):
            if ref not in references:
                references[ref] = attnprobe.reference(ref, q, k, v, scale, mask=mask)
            case = group.iloc[0]
            est = attnprobe.estimate(spec, q, k, v, scale, seed=SEED, trial=int(trial), case=case, threads=3,
                                     mask=mask)
            values = attnprobe.metrics(references[ref], est, list(group["metric"]))
            for metric, value in zip(group["metric"], group["value"]):
                assert same(values[metric], value), (spec, mask, trial, metric, values[metric], value)
            checked.add(spec)
    # Every variant of every registered estimator was compared (those that compress a prompt, decode rows only, in
    # test_prompt_estimators_sweep_decode_rows_as_the_cli).
    prompt = set(cli("list", "--variants", "--prompt").stdout.split())
    prompt |= set(cli("list", "--variants", "--prompt", "--rotary").stdout.split())  # they need rotary frequencies
    assert checked == set(all_variants()) - prompt


def test_sweep_dataframe_and_csv_equal_the_cli(tmp_path):
    specs = ["vmean", "performer(M=16)", "yoso(m=8,tau=4)", "nystrom(L=8)"]
    common = dict(layers="0,1", heads="0", batch="0..1", lengths="64,128", samples=None, trials=3, seed=5)
    args = ["sweep", DUMP, "--layers", "0,1", "--heads", "0", "--batch", "0..1", "--lengths", "64,128", "--trials",
            "3", "--seed", "5", "-q", "-o", str(tmp_path / "cli.csv")]
    for s in specs:
        args += ["-e", s]
    cli(*args)
    df = attnprobe.sweep(DUMP, specs, output=tmp_path / "py.csv", threads=2, **common)
    assert (tmp_path / "py.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
    assert (tmp_path / "py.csv.run.json").exists()
    expected = pd.read_csv(tmp_path / "cli.csv", float_precision="round_trip",
                           dtype={c: str for c in ["dump", "estimator", "spec", "reference", "metric"]})
    pd.testing.assert_frame_equal(df, expected, check_exact=True)
    in_memory = attnprobe.sweep(DUMP, specs, threads=1, **common)  # no output file, one thread
    pd.testing.assert_frame_equal(in_memory, expected, check_exact=True)
    # summarize() equals the CLI's summarize.
    cli("summarize", str(tmp_path / "cli.csv"), "-o", str(tmp_path / "sum.csv"))
    pd.testing.assert_frame_equal(attnprobe.summarize(df), attnprobe.read_csv(tmp_path / "sum.csv"), check_exact=True)
    # write_csv() writes what the CLI writes, byte for byte.
    attnprobe.write_csv(df, tmp_path / "again.csv")
    assert (tmp_path / "again.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
    attnprobe.write_csv(attnprobe.summarize(df), tmp_path / "sum2.csv")
    assert (tmp_path / "sum2.csv").read_bytes() == (tmp_path / "sum.csv").read_bytes()
    cli("summarize", str(tmp_path / "cli.csv"), "--over", "layer,head,batch", "-o", str(tmp_path / "over.csv"))
    pd.testing.assert_frame_equal(attnprobe.summarize(df, over="layer,head,batch"),
                                  attnprobe.read_csv(tmp_path / "over.csv"), check_exact=True)


def test_python_sweep_output_is_a_shard_merge_and_resume_accept(tmp_path):
    # run.json carries the CLI's plan record: a Python shard merges with a CLI shard of the same plan
    # into the CLI's whole sweep byte for byte, and the CLI resumes a Python sweep's file.
    specs = ["vmean", "performer(M=16)", "yoso(m=8,tau=4)"]
    def grid_of(trials):
        return ["--layers", "0,1", "--heads", "0", "--batch", "0..1", "--lengths", "64,128", "--trials", str(trials),
                "--seed", "3", "-q"] + [a for s in specs for a in ("-e", s)]

    grid = grid_of(2)
    common = dict(layers="0,1", heads="0", batch="0..1", lengths="64,128", trials=2, seed=3, threads=2)
    cli("sweep", DUMP, *grid, "-o", str(tmp_path / "cli.csv"))
    attnprobe.sweep(DUMP, specs, output=tmp_path / "py0.csv", shard="0/2", **common)
    cli("sweep", DUMP, *grid, "--shard", "1/2", "-o", str(tmp_path / "cli1.csv"))
    py_plan = json.loads((tmp_path / "py0.csv.run.json").read_text())["plan"]
    cli_plan = json.loads((tmp_path / "cli1.csv.run.json").read_text())["plan"]
    assert py_plan["fingerprint"] == cli_plan["fingerprint"]
    assert py_plan["shard"] == {"index": 0, "count": 2}
    assert 0 < len(py_plan["units"]) < py_plan["units_total"]  # a real shard: part of the units
    cli("merge", "-o", str(tmp_path / "merged.csv"), str(tmp_path / "py0.csv"), str(tmp_path / "cli1.csv"))
    assert (tmp_path / "merged.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
    # The whole plan from Python: the CLI's --resume finds every trial finished and leaves the rows as they are.
    attnprobe.sweep(DUMP, specs, output=tmp_path / "py.csv", **common)
    assert (tmp_path / "py.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
    resumed = cli("sweep", DUMP, *grid, "--resume", "-o", str(tmp_path / "py.csv"))
    assert (tmp_path / "py.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes(), resumed.stderr
    # ...and refuses it for another grid (the plan fingerprint differs): exit 2.
    other = subprocess.run([BINARY, "sweep", DUMP, *grid_of(3), "--resume", "-o", str(tmp_path / "py.csv")],
                           capture_output=True, text=True)
    assert other.returncode == 2 and "another grid" in other.stderr, other.stderr
    cli("summarize", str(tmp_path / "py0.csv"), "-o", str(tmp_path / "sum0.csv"))


def test_ctrl_c_stops_a_sweep_and_resume_completes_it(tmp_path):
    """KeyboardInterrupt reaches a running sweep (before, it waited for the whole sweep): the finished
    trials are in the CSV and run.json says interrupted; resume=True then equals an uninterrupted run."""
    out = tmp_path / "stopped.csv"
    grid = dict(layers=0, heads=0, batch=0, lengths=[32, 64], trials=20000, threads=2, seed=SEED)
    script = (f"import attnprobe\nattnprobe.sweep({DUMP!r}, ['performer(M=16)'], output={str(out)!r}, "
              f"**{grid!r})\n")
    package = os.path.dirname(os.path.dirname(os.path.abspath(attnprobe.__file__)))  # the package under test
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package, os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, env=env)
    info = tmp_path / "stopped.csv.run.json"
    for _ in range(600):  # run.json appears when the sweep starts
        if info.exists() or child.poll() is not None:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    started = time.monotonic()
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    stopped_in = time.monotonic() - started  # observed 0.32 s; the whole sweep takes ~2.3 s
    assert child.returncode != 0 and "KeyboardInterrupt" in err, err
    assert stopped_in < 1.5, stopped_in
    run = json.loads(info.read_text())
    assert run["finished"] is None and run["interrupted"], run
    kept = attnprobe.read_csv(out)
    assert 0 < len(kept) < 2 * 20000 * 9 and len(kept) % 9 == 0
    attnprobe.sweep(DUMP, ["performer(M=16)"], output=out, resume=True, **grid)
    whole = tmp_path / "whole.csv"
    attnprobe.sweep(DUMP, ["performer(M=16)"], output=whole, **grid)
    assert sorted(out.read_text().splitlines()) == sorted(whole.read_text().splitlines())


def test_interpreter_exit_with_a_sweep_on_a_daemon_thread_is_clean():
    """The interpreter exiting while a daemon thread runs a sweep (with a custom estimator, which needs
    the GIL) aborted the process (terminate, or 'exception not rethrown'); atexit now stops the sweep."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(attnprobe.__file__)))
    script = (f"import sys, threading, time\nsys.path.insert(0, {package!r})\nimport attnprobe, numpy as np\n"
              "def slow(q, k, v, scale, causal, seed):\n    time.sleep(0.001)\n    return np.tile(v.mean(0), (len(v), 1))\n"
              f"threading.Thread(target=lambda: attnprobe.sweep({DUMP!r}, ['vmean'], custom={{'slow': slow}}, "
              "lengths=[32, 64], trials=300, threads=1, metrics='fro_rel'), daemon=True).start()\n"
              "time.sleep(1.0)\n")
    for _ in range(3):  # the abort came in 1 run of 3 without a custom estimator, every run with one
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr


def test_causal_matches_the_cli_and_numpy(tmp_path):
    # causal=True is the CLI's --mask causal: the masked softmax (numpy to 1e-12), each causal form's
    # estimate bit for bit the sweep's (its case id ends in ';mask=causal'), a refusal for estimators
    # without a causal form, and a Slice that carries the mask.
    q, k, v, scale, causal = attnprobe.load(DUMP, 1, 1, 1, length=96)
    assert causal is False  # synth-demo's layers are not causal: the mask is asked for explicitly
    logits = scale * q @ k.T
    logits[np.triu_indices(96, 1)] = -np.inf
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    want = (w / w.sum(axis=1, keepdims=True)) @ v
    assert np.abs(attnprobe.exact(q, k, v, scale, causal=True) - want).max() < 1e-12
    assert np.abs(attnprobe.exact(q, k, v, scale) - want).max() > 1e-3  # the mask changed the result
    specs = [e["spec"] for e in attnprobe.estimators() if e["causal"]]
    args = ["sweep", DUMP, "--layers", "1", "--heads", "1", "--batch", "1", "--lengths", "96", "--trials", "2",
            "--seed", str(SEED), "--mask", "causal", "-q", "-o", str(tmp_path / "causal.csv")]
    cli(*args, *[a for s in specs for a in ("-e", s)])
    rows = attnprobe.read_csv(tmp_path / "causal.csv")
    assert set(rows["mask"]) == {"causal"}
    sl = attnprobe.Slice(q, k, v, scale, causal=True)
    assert sl.causal
    for (spec, ref, trial), group in rows.groupby(["spec", "reference", "trial"], sort=False):
        case = group.iloc[0]
        reference = attnprobe.reference(ref, q, k, v, scale, causal=True)
        for est in (attnprobe.estimate(spec, q, k, v, scale, causal=True, seed=SEED, trial=int(trial), case=case),
                    attnprobe.estimate(spec, sl, seed=SEED, trial=int(trial), case=case)):
            values = attnprobe.metrics(reference, est, list(group["metric"]))
            for metric, value in zip(group["metric"], group["value"]):
                assert same(values[metric], value), (spec, trial, metric, values[metric], value)
    with pytest.raises(ValueError, match="causal"):
        attnprobe.estimate("nystrom", q, k, v, scale, causal=True)
    with pytest.raises(ValueError, match="Slice"):
        attnprobe.estimate("softmax", sl, causal=True)
    # A sweep's mask= is the CLI's --mask: the same rows.
    df = attnprobe.sweep(DUMP, specs, layers="1", heads="1", batch="1", lengths="96", trials=2, seed=SEED,
                         mask="causal", threads=2)
    attnprobe.write_csv(df, tmp_path / "py.csv")
    assert (tmp_path / "py.csv").read_bytes() == (tmp_path / "causal.csv").read_bytes()


def test_exact_float64_matches_numpy_softmax():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(300, 24)), rng.normal(size=(300, 24)), rng.normal(size=(300, 20))
    scale = 0.3
    s = scale * q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    expected = (p / p.sum(axis=1, keepdims=True)) @ v
    out = attnprobe.exact(q, k, v, scale)
    assert out.dtype == np.float64 and out.shape == (300, 20)
    assert np.abs(out - expected).max() < 1e-12  # observed 2.3e-15
    out32 = attnprobe.exact(q, k, v, scale, dtype=np.float32)
    assert out32.dtype == np.float32
    assert np.abs(out32 - expected).max() < 1e-5  # observed 1.1e-6 (float32 kernel)
    # Default scale is 1/sqrt(p), as for a dump without a scale attribute.
    assert np.array_equal(attnprobe.exact(q, k, v), attnprobe.exact(q, k, v, 1 / math.sqrt(24)))


def test_threads_and_input_dtype_do_not_change_results():
    q, k, v, scale, _ = attnprobe.load(DUMP, 0, 1, 0, length=200)
    a = attnprobe.estimate("skeinformer(d=16)", q, k, v, scale, seed=3, trial=1, threads=1)
    b = attnprobe.estimate("skeinformer(d=16)", q, k, v, scale, seed=3, trial=1, threads=4)
    assert np.array_equal(a, b)
    # Fortran order, a strided view and float32 input: the same float32 slice reaches the estimator.
    q32, k32, v32 = (np.asfortranarray(x.astype(np.float32)) for x in (q, k, v))
    c = attnprobe.estimate("performer(M=16)", q32, k32, v32, scale, seed=3)
    wide = np.zeros((v.shape[0], 2 * v.shape[1]))
    wide[:, ::2] = v
    d = attnprobe.estimate("performer(M=16)", q.astype(np.float32), k, wide[:, ::2], scale, seed=3)
    assert np.array_equal(c, d)
    # ...and C-contiguous float64 (the dump holds float16, so every float32 copy above is exact),
    # converted in blocks over 4 threads: the dense, strided, float32 and threaded paths agree.
    assert np.array_equal(c, attnprobe.estimate("performer(M=16)", q, k, v, scale, seed=3, threads=4))
    # Another case, another draw; case=None is layer 0, head 0, batch 0.
    e = attnprobe.estimate("performer(M=16)", q, k, v, scale, seed=3, case={"layer": 0, "head": 0, "batch": 0})
    f = attnprobe.estimate("performer(M=16)", q, k, v, scale, seed=3, case={"layer": 0, "head": 1, "batch": 0})
    assert np.array_equal(attnprobe.estimate("performer(M=16)", q, k, v, scale, seed=3), e)
    assert not np.array_equal(e, f)


def test_threaded_input_copy_leaves_numpy_reference_counts_alone():
    # The copy into the library's matrices runs on pool threads without the GIL. It once asked numpy
    # each block's dtype there, which raced on the dtype objects' reference counts: float64's drifted
    # by 5-29 over these calls (3 runs of 3 before the fix; 0 after) and, when a count reached zero,
    # pytest crashed. 1000 blocks of 64 rows per matrix give the two threads ~6000 overlapping tests.
    rows = np.random.default_rng(0).standard_normal((64 * 1000, 1))
    for x in (rows, rows.astype(np.float32)):
        attnprobe.estimate("vmean", x, x, x, threads=2)  # whatever a first call caches, it keeps
        before = sys.getrefcount(x.dtype)
        for _ in range(1000):
            attnprobe.estimate("vmean", x, x, x, threads=2)
        after = sys.getrefcount(x.dtype)  # not inside the assert: pytest's rewrite holds x.dtype there
        assert after == before


def test_calls_from_several_python_threads_give_the_serial_results():
    # Four Python threads at once (the GIL released in each call): the shared pool is leased to one
    # call and the others build their own, each thread converts into its own slice memory, and a
    # sweep registers its custom estimator meanwhile. Every result equals the one computed alone.
    import threading
    q, k, v, scale, _ = attnprobe.load(DUMP, 0, 0, 0, length=256)
    specs = ["performer(M=16)", "lara(C=8)", "nystrom(L=8)", "skeinformer(d=16)"]
    alone = {s: attnprobe.estimate(s, q, k, v, scale, seed=5, threads=2) for s in specs}
    errors, results = [], {}

    def run(spec):
        try:
            for _ in range(20):
                results[spec] = attnprobe.estimate(spec, q, k, v, scale, seed=5, threads=2)
                if not np.array_equal(results[spec], alone[spec]):
                    errors.append(spec)
                    return
        except Exception as error:  # reported below, not lost in the thread
            errors.append(f"{spec}: {error!r}")

    threads = [threading.Thread(target=run, args=(s,)) for s in specs]
    for t in threads:
        t.start()
    attnprobe.sweep(DUMP, [], custom={"concurrent": exact_softmax}, layers=0, heads=0, batch=0, lengths=[32],
                    trials=1)
    for t in threads:
        t.join()
    assert errors == [] and sorted(results) == sorted(specs)


def test_slice_gives_the_same_results():
    q, k, v, scale, _ = attnprobe.load(DUMP, 1, 0, 0, length=150)
    s = attnprobe.Slice(q, k, v, scale)
    assert (s.n, s.p, s.pv, s.scale) == (150, 32, 32, scale) and np.array_equal(s.v, v)
    case = {"layer": 1, "head": 0, "batch": 0}
    for spec in ["performer(M=16)", "yoso(m=8)", "lara(C=8)"]:
        assert np.array_equal(attnprobe.estimate(spec, s, seed=4, trial=2, case=case),
                              attnprobe.estimate(spec, q, k, v, scale, seed=4, trial=2, case=case))
    assert np.array_equal(attnprobe.exact(s), attnprobe.exact(q, k, v, scale))
    assert np.array_equal(attnprobe.reference("yoso-e", s), attnprobe.reference("yoso-e", q, k, v, scale))
    with pytest.raises(ValueError, match="leave k, v and scale out"):
        attnprobe.estimate("vmean", s, k, v)


def test_metrics_names_order_and_dtypes():
    q, k, v, scale, _ = attnprobe.load(DUMP, 0, 0, 0, length=64)
    ref = attnprobe.exact(q, k, v, scale)
    est = attnprobe.estimate("vmean", q, k, v, scale)
    m = attnprobe.metrics(ref, est, "angle,spec")
    assert list(m) == ["angle", "spec"]
    assert list(attnprobe.metrics(ref, est)) == attnprobe.metric_names()
    # A float64 estimate is rounded to float32 first, as the CSV's estimates are.
    assert attnprobe.metrics(ref, est.astype(np.float64)) == attnprobe.metrics(ref, est)
    assert attnprobe.metrics(ref, ref.astype(np.float32))["spec_rel"] < 1e-6  # observed 1.9e-8


# ---- custom estimators ----------------------------------------------------------------------------------

try:
    import torch
except ImportError:  # pragma: no cover - Debian's python3-torch is a dependency (tools/install_deps.sh)
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="python3-torch is not installed")


def exact_softmax(q, k, v, scale, causal, seed):
    s = scale * q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def torch_performer(features):
    """A plain positive-random-feature Performer in torch, drawing with a generator keyed by seed."""

    def fn(q, k, v, scale, causal, seed):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
        w = torch.randn(features, q.shape[1], generator=g, dtype=q.dtype)

        def phi(x):
            x = x * math.sqrt(scale)
            logits = x @ w.T - (x * x).sum(1, keepdim=True) / 2
            return torch.exp(logits - logits.max())

        qf, kf = phi(q), phi(k)
        return (qf @ (kf.T @ v)) / (qf @ kf.sum(0)).unsqueeze(1)

    return fn


CUSTOM_SLICE = dict(layers=0, heads="0,1", batch=0, lengths=[128], seed=11)


def test_custom_exact_softmax_scores_zero_error():
    df = attnprobe.sweep(DUMP, ["vmean"], custom={"exact": exact_softmax}, trials=2, **CUSTOM_SLICE)
    mine = df[df["spec"] == "py:exact"]
    assert set(mine["estimator"]) == {"py:exact"} and set(mine["reference"]) == {"softmax"}
    assert len(mine) == 2 * 2 * len(attnprobe.metric_names())  # 2 heads x 2 trials x metrics
    spec_rel = mine[mine["metric"] == "spec_rel"]["value"]
    assert spec_rel.max() < 1e-6  # observed 2.1e-8: float32 rounding of the output only
    assert (df[(df["spec"] == "vmean") & (df["metric"] == "spec_rel")]["value"] > 0.1).all()  # observed min 0.98
    summary = attnprobe.summarize(df)
    assert set(summary["spec"]) == {"vmean", "py:exact"}


def causal_softmax(q, k, v, scale, causal, seed):
    s = scale * q @ k.T
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def test_custom_estimators_run_causal_cases_and_a_leak_is_refused():
    """A causal case passes causal=True (before, a causal sweep with custom= was refused); a function
    that ignores it, or draws unseeded noise, is refused on any causal call, not only its first."""
    df = attnprobe.sweep(DUMP, ["performer"], custom={"exact": causal_softmax}, mask="causal", trials=2,
                         **CUSTOM_SLICE)
    mine = df[df["spec"] == "py:exact"]
    assert set(mine["mask"]) == {"causal"} and len(mine) == 2 * 2 * len(attnprobe.metric_names())
    assert mine[mine["metric"] == "spec_rel"]["value"].max() < 1e-6  # observed 1.8e-8: float32 rounding
    # The same function swept with the full mask gets causal=False and matches full softmax.
    full = attnprobe.sweep(DUMP, [], custom={"exact": causal_softmax}, mask="full", trials=1, **CUSTOM_SLICE)
    assert full[full["metric"] == "spec_rel"]["value"].max() < 1e-6  # observed 2.1e-8
    with pytest.raises(attnprobe.EstimatorError,
                       match="is not causal: row .* from 64 on were replaced.*n=128;spec=py:full;mask=causal, trial 0"):
        attnprobe.sweep(DUMP, [], custom={"full": exact_softmax}, mask="causal", trials=1, **CUSTOM_SLICE)
    # The seed is the causal case's key (its id ends in ;mask=causal), as for the built-ins.
    seen = []

    def recording(q, k, v, scale, causal, seed):
        seen.append((causal, seed))
        return causal_softmax(q, k, v, scale, causal, seed)

    attnprobe.sweep(DUMP, [], custom={"rec": recording}, mask="causal", trials=2, **CUSTOM_SLICE)
    keys = {attnprobe.random_key(11, attnprobe.case_id(0, h, 0, 128, "py:rec", causal=True), t)
            for h in (0, 1) for t in range(2)}
    assert {causal for causal, _ in seen} == {True} and {seed for _, seed in seen} == keys
    assert len(seen) == 4 + 4  # 2 heads x 2 trials, each with the leak check's second call
    # A custom name's case id before any sweep registered it (was "unknown estimator").
    assert attnprobe.case_id(0, 1, 0, 8, "py:not_swept_yet", causal=True) == \
        "layer=0;head=1;batch=0;n=8;spec=py:not_swept_yet;mask=causal"

    calls = []

    def leaks_after_first(q, k, v, scale, causal, seed):  # causal for the first call and its check only
        calls.append(seed)
        return causal_softmax(q, k, v, scale, causal and len(calls) <= 2, seed)

    # Passed when only the first causal call was checked; now the second call fails.
    with pytest.raises(attnprobe.EstimatorError, match="is not causal"):
        attnprobe.sweep(DUMP, [], custom={"late": leaks_after_first}, mask="causal", trials=2, **CUSTOM_SLICE)

    def lift_like(q, k, v, scale, causal, seed):  # masked, but keys scaled by the whole sequence's largest norm
        return causal_softmax(q, 3 * k / np.linalg.norm(k, axis=1).max(), v, scale, causal, seed)

    with pytest.raises(attnprobe.EstimatorError, match="is not causal"):  # passed when the check only reversed
        attnprobe.sweep(DUMP, [], custom={"lift": lift_like}, mask="causal", trials=1, **CUSTOM_SLICE)

    def unseeded(q, k, v, scale, causal, seed):
        return causal_softmax(q, k, v, scale, causal, seed) * (1 + 0.01 * np.random.default_rng().normal())

    with pytest.raises(attnprobe.EstimatorError, match="not seeded by its seed"):
        attnprobe.sweep(DUMP, [], custom={"noisy": unseeded}, mask="causal", trials=1, **CUSTOM_SLICE)


@needs_torch
def test_degraded_custom_estimator_is_caught_by_check(tmp_path):
    baseline = attnprobe.summarize(
        attnprobe.sweep(DUMP, ["performer(M=64)"], custom={"mine": torch_performer(64)}, trials=8, **CUSTOM_SLICE))
    baseline_path = tmp_path / "baseline.csv"
    attnprobe.write_csv(baseline, baseline_path)
    again = attnprobe.sweep(DUMP, ["performer(M=64)"], custom={"mine": torch_performer(64)}, trials=8, **CUSTOM_SLICE)
    report = attnprobe.check(again, baseline_path)
    assert report.passed and report.regressions == 0, report  # same function, same seeds: identical numbers
    worse = attnprobe.sweep(DUMP, ["performer(M=64)"], custom={"mine": torch_performer(4)}, trials=8, **CUSTOM_SLICE)
    report = attnprobe.check(worse, baseline_path, metrics="spec_rel,fro_rel")
    assert not report.passed and report.regressions >= 2, report  # observed 3 (of 4: head 0 spec_rel is within 4 se)
    assert set(report.failures()["spec"]) == {"py:mine"}
    assert "FAILED" in str(report)


def test_custom_seed_is_the_case_key():
    seen = []

    def record(q, k, v, scale, causal, seed):
        seen.append((q.shape, seed))
        return np.zeros_like(v)

    attnprobe.sweep(DUMP, [], custom={"rec": record}, trials=3, threads=2, **CUSTOM_SLICE)
    keys = {attnprobe.random_key(11, attnprobe.case_id(0, h, 0, 128, "py:rec"), t) for h in (0, 1) for t in range(3)}
    assert {s for _, s in seen} == keys and len(seen) == 6


@pytest.mark.parametrize("result, message", [
    ("raise", "raised ZeroDivisionError"),
    ("shape", "returned shape (64, 3), expected (64, 32)"),
    ("nan", "non-finite value"),
    ("list", "returned a list"),
])
def test_custom_errors_name_the_case(tmp_path, result, message):
    def broken(q, k, v, scale, causal, seed):
        if q.shape[0] < 64:  # the first slice (n = 32) works; n = 64 fails
            return exact_softmax(q, k, v, scale, causal, seed)
        if result == "raise":
            return 1 / 0
        if result == "shape":
            return np.zeros((64, 3))
        if result == "nan":
            out = np.zeros_like(v)
            out[5, 2] = np.nan
            return out
        return [[0.0] * v.shape[1]] * v.shape[0]

    output = tmp_path / "partial.csv"
    with pytest.raises(attnprobe.EstimatorError) as info:
        attnprobe.sweep(DUMP, ["vmean"], custom={"broken": broken}, layers=0, heads=0, batch=0, lengths=[32, 64],
                        trials=2, seed=1, threads=1, output=output)
    error = info.value
    assert message in str(error)
    assert "layer=0;head=0;batch=0;n=64;spec=py:broken" in str(error) and error.trial == 0
    # The finished slice (n = 32) is in the CSV, whole; resuming with a working function completes it.
    partial = attnprobe.read_csv(output)
    assert set(partial["n"]) == {32} and len(partial) == 3 * len(attnprobe.metric_names())
    done = attnprobe.sweep(DUMP, ["vmean"], custom={"broken": exact_softmax}, layers=0, heads=0, batch=0,
                           lengths=[32, 64], trials=2, seed=1, output=output, resume=True)
    fresh = attnprobe.sweep(DUMP, ["vmean"], custom={"broken": exact_softmax}, layers=0, heads=0, batch=0,
                            lengths=[32, 64], trials=2, seed=1)
    pd.testing.assert_frame_equal(done, fresh, check_exact=True)


# ---- torch in, errors, documentation ----------------------------------------------------------------------

@needs_torch
def test_torch_tensors_in_and_out():
    q, k, v, scale, _ = attnprobe.load(DUMP, 1, 0, 1, length=128)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    assert np.shares_memory(attnprobe._as_array(tq, "q"), q)  # read in place, no copy
    assert np.array_equal(attnprobe.estimate("yoso(m=8)", tq, tk, tv, scale, seed=2),
                          attnprobe.estimate("yoso(m=8)", q, k, v, scale, seed=2))
    tq32 = tq.float().requires_grad_()
    assert np.array_equal(attnprobe.exact(tq32, tk.float(), tv.float(), scale),
                          attnprobe.exact(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), scale))
    bf = attnprobe.exact(tq.bfloat16(), tk.bfloat16(), tv.bfloat16(), scale)  # numpy lacks bfloat16: via float32
    assert np.abs(bf - attnprobe.exact(q, k, v, scale)).max() < 0.01  # observed 7.6e-4 (bfloat16 inputs)
    df = attnprobe.sweep(DUMP, [], custom={"t": lambda q, k, v, s, c, seed: torch.from_numpy(
        exact_softmax(q, k, v, s, c, seed)).float()}, layers=1, heads=0, batch=1, lengths=[64], trials=1)
    assert df[df["metric"] == "spec_rel"]["value"].max() < 1e-6  # observed 1.0e-8


def test_errors_carry_the_cli_messages():
    q, k, v, scale, _ = attnprobe.load(DUMP, 0, 0, 0, length=32)
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        attnprobe.estimate("nope", q, k, v)
    with pytest.raises(ValueError, match="has no parameter 'x'"):
        attnprobe.estimate("yoso(x=1)", q, k, v)
    with pytest.raises(ValueError, match="has no causal form"):
        attnprobe.estimate("nystrom", q, k, v, causal=True)
    with pytest.raises(ValueError, match="v needs one row per key"):
        attnprobe.estimate("vmean", q, k[:10], v)
    with pytest.raises(ValueError, match="q has 32 rows but k only 10.*cross=True"):
        attnprobe.estimate("vmean", q, k[:10], v[:10])
    with pytest.raises(ValueError, match="2-D array"):
        attnprobe.exact(q[0], k, v)
    with pytest.raises(OSError, match="cannot read 'missing.h5'") as info:
        attnprobe.load("missing.h5", 0, 0, 0)
    assert isinstance(info.value, attnprobe.InputError)
    with pytest.raises(attnprobe.InputError, match="length 5000"):
        attnprobe.sweep(DUMP, ["vmean"], lengths=[5000])
    with pytest.raises(ValueError, match="unknown estimator 'py:nothing'"):
        attnprobe.sweep(DUMP, ["py:nothing"])
    attnprobe.sweep(DUMP, [], custom={"once": exact_softmax}, layers=0, heads=0, batch=0, lengths=[16], trials=1)
    with pytest.raises(ValueError, match="is a Python callable: pass it to attnprobe.sweep"):
        attnprobe.sweep(DUMP, ["py:once"], layers=0, heads=0, batch=0, lengths=[16])
    # Numbers out of range or not integers are ValueErrors saying the range: they were truncated
    # (seed=1.5, lengths=[16.5]), wrapped, passed on (threads=10**6 started 32449 threads), or left to
    # pybind11's TypeError (seed=-1).
    for call, message in [(lambda: attnprobe.estimate("vmean", q, k, v, seed=-1), "seed must be in 0"),
                          (lambda: attnprobe.estimate("vmean", q, k, v, seed=1.5), "seed must be an integer"),
                          (lambda: attnprobe.estimate("vmean", q, k, v, trial=2**32), "trial must be in"),
                          (lambda: attnprobe.estimate("vmean", q, k, v, threads=10**6), r"0\.\.1024"),
                          (lambda: attnprobe.estimate("vmean", q, k, v, case={"layer": -1, "head": 0, "batch": 0}),
                           "case layer must be in"),
                          (lambda: attnprobe.load(DUMP, 0, 0, 0, length=3.5), "length must be an integer"),
                          (lambda: attnprobe.load(DUMP, 0, 0, 0, num_heads=-1), "num_heads"),
                          (lambda: attnprobe.sweep(DUMP, ["vmean"], lengths=[16.5]), "lengths must be an integer"),
                          (lambda: attnprobe.sweep(DUMP, ["vmean"], lengths=[0]), "lengths must be in 1"),
                          (lambda: attnprobe.sweep(DUMP, ["vmean"], trials=0), "trials must be in 1"),
                          (lambda: attnprobe.metrics(q, q, ["bias_fro_rel"]), "case metric")]:
        with pytest.raises(ValueError, match=message):
            call()
    # Non-finite inputs, and float64 values beyond float32's range, are refused with the position: YOSO
    # returned a finite estimate for a query holding inf (its hashes see signs only), others NaN.
    bad_q, big_v = q.astype(np.float64), v.astype(np.float64)
    bad_q[3, 2], big_v[5, 1] = np.inf, 1e300
    for spec in ["yoso(m=4)", "softmax", "performer(M=8)"]:
        with pytest.raises(ValueError, match="q holds inf at row 3, column 2"):
            attnprobe.estimate(spec, bad_q, k, v)
    with pytest.raises(ValueError, match="v holds 1e\\+300 at row 5, column 1: beyond float32"):
        attnprobe.exact(q, k, big_v)
    with pytest.raises(ValueError, match="k holds nan"):
        attnprobe.Slice(q, np.where(k == k[7, 1], np.nan, k), v)
    # Finite values that overflow the float32 estimators (the dump readers' limits, 1e18 per row and 1e30
    # per score): ra returned NaN rows at 1e19, or a ValueError about its sampling weights. At 1e11 every
    # estimator is still finite (checked), and accepted.
    for big in (1e19, 1e15):
        with pytest.raises(ValueError, match="values this large overflow"):
            attnprobe.estimate("ra", big * q, big * k, v, causal=True)
    assert np.isfinite(attnprobe.estimate("ra", 1e11 * q, 1e11 * k, v, causal=True)).all()
    with pytest.raises(ValueError, match="scale 1e\\+39"):
        attnprobe.exact(q, k, v, scale=1e39)
    with pytest.raises(ValueError, match="at least one row"):  # was spec 0, NaN elsewhere
        attnprobe.metrics(np.zeros((0, 4)), np.zeros((0, 4)))
    # A repeated length is one length (its cases were written twice, which check then refused).
    twice = attnprobe.sweep(DUMP, ["vmean"], layers=0, heads=0, batch=0, lengths=[16, 16], trials=1)
    assert len(twice) == len(twice.drop_duplicates(["n", "metric"]))


def test_help_teaches_with_an_example():
    doc = attnprobe.sweep.__doc__
    assert "Example" in doc and "custom=" in doc and "attnprobe.check" in doc
    assert "case" in attnprobe.estimate.__doc__


def test_python_readers_and_check_validate_as_the_cli(tmp_path):
    # The Python readers took a negative error the CLI refuses, and Python's check gated topk_recall
    # (larger is better) as an error.
    rows = attnprobe.sweep(DUMP, ["vmean", "performer(M=16)"], metrics="fro_rel,case,weights", trials=4, seed=3,
                           **SLICE)
    path = tmp_path / "rows.csv"
    attnprobe.write_csv(rows, path)
    report = attnprobe.check(path, path)  # case rows (trial -1) and weight metrics gate
    assert report.passed and report.compared > 0, report
    assert {"bias_fro_rel", "topk_recall", "row_kl"} <= set(report.comparisons["metric"])
    broken = rows.copy()
    broken.loc[broken.index[0], "value"] = -0.5
    attnprobe.write_csv(broken, tmp_path / "broken.csv")
    for read in (attnprobe.read_csv, attnprobe.summarize, lambda p: attnprobe.check(p, path)):
        with pytest.raises(attnprobe.InputError, match="is never negative"):
            read(tmp_path / "broken.csv")
    base = attnprobe.summarize(rows)
    better = base.copy()
    recall = better["metric"] == "topk_recall"
    better.loc[recall, "mean"] = np.minimum(better.loc[recall, "mean"] + 0.2, 1.0)
    better.loc[recall, ["std", "stderr"]] = 0.0
    report = attnprobe.check(better, base, metrics="topk_recall")
    assert report.regressions == 0 and report.passed, report
    report = attnprobe.check(base, better, metrics="topk_recall")
    assert report.regressions > 0, report


def test_python_check_fails_closed_on_numbers(tmp_path):
    # Before: each of these passed (an infinite or huge standard error made the allowed increase infinite).
    rows = attnprobe.sweep(DUMP, ["performer(M=16)"], metrics="spec_rel", trials=4, seed=3, **SLICE)
    base = attnprobe.summarize(rows)
    for mean_shift, se in ((0.5, math.inf), (0.5, 1e200), (1e200, 0.0), (0.5, 1e9)):
        worse = base.copy()
        worse["mean"] = worse["mean"] + mean_shift
        worse[["median", "min", "max"]] = worse[["median", "min", "max"]] + mean_shift
        worse[["std", "stderr"]] = se
        with pytest.raises(attnprobe.InputError, match="new row 0|standard error over"):
            attnprobe.check(worse, base)
    huge = rows.copy()
    huge.loc[huge.index[0], "value"] = 1e300
    with pytest.raises(attnprobe.InputError, match="new row 0 \\(new run\\): the value is 1e\\+300"):
        attnprobe.check(huge, rows)
    with pytest.raises(ValueError):
        attnprobe.check(rows, rows, z=1e308)


def test_report_is_the_clis_page(tmp_path):
    csv = tmp_path / "run.csv"
    attnprobe.sweep(DUMP, ["softmax", "vmean", "performer(M=16)"], lengths=[48, 96], layers="0,1", trials=3, seed=1,
                    output=str(csv))
    page = attnprobe.report(str(csv), baseline=str(csv), output=tmp_path / "py.html")
    assert (tmp_path / "py.html").read_text() == page
    cli("report", str(csv), str(csv), "-o", str(tmp_path / "cli.html"))
    # The same page but for the line naming its writer; run.json's command shows in both.
    writer = re.compile(r"Written by [^<]*\.")
    assert writer.sub("", page) == writer.sub("", (tmp_path / "cli.html").read_text())
    assert '<p class="verdict passed">passed' in page and "attnprobe.report() (Python)" in page
    # A DataFrame works too (no run.json to show); errors are the CLI's.
    frame_page = attnprobe.report(attnprobe.read_csv(csv), metrics="angle")
    assert "No run.json beside the CSV" in frame_page and "angle against n" in frame_page
    with pytest.raises(ValueError, match="the run has no such metric"):
        attnprobe.report(str(csv), metrics=["mass_recall"])


def test_sweep_output_never_replaces_the_dump(tmp_path):
    dump = tmp_path / "mine.h5"
    dump.write_bytes(open(DUMP, "rb").read())
    before = dump.read_bytes()
    with pytest.raises(ValueError, match="would overwrite its own input"):
        attnprobe.sweep(dump, ["vmean"], output=tmp_path / "." / "mine.h5", overwrite=True, **SLICE)
    assert dump.read_bytes() == before


def test_parsing_does_not_depend_on_the_host_locale(tmp_path):
    """A host process under a comma locale (de_DE) read "0.5" in a spec or a CSV as 0 and ".5": strtod
    follows LC_NUMERIC. The locale is built here with localedef (no root needed) and skipped without it."""
    locales = tmp_path / "locales"
    locales.mkdir()
    made = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")],
                          capture_output=True, text=True)
    if not (locales / "de_DE.UTF-8").exists():
        pytest.skip(f"localedef could not build de_DE.UTF-8: {made.stderr.strip()[:200]}")
    script = f"""
import locale, attnprobe
locale.setlocale(locale.LC_ALL, "de_DE.UTF-8")
assert locale.localeconv()["decimal_point"] == ",", locale.localeconv()
q, k, v, scale, causal = attnprobe.load({DUMP!r}, 0, 0, 0, length=64)
a = attnprobe.estimate("lara(beta=0.5)", q, k, v, scale, seed=1)
rows = attnprobe.sweep({DUMP!r}, ["performer(M=16)"], metrics="spec_rel", trials=2, seed=3, layers="0", heads="0",
                       batch="0", lengths="64")
attnprobe.write_csv(rows, {str(tmp_path / "de.csv")!r})
back = attnprobe.read_csv({str(tmp_path / "de.csv")!r})
assert attnprobe.check(back, rows).passed
print("ok", float(abs(a).sum()))
"""
    package = os.path.dirname(os.path.dirname(os.path.abspath(attnprobe.__file__)))
    env = dict(os.environ, LOCPATH=str(locales),
               PYTHONPATH=os.pathsep.join([package] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-2000:]


def test_read_csv_names_the_file_it_refuses(tmp_path):
    # An empty file raised pandas' EmptyDataError, and a CSV of other columns listed the expected columns twice
    # instead of the file's own.
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(attnprobe.InputError, match="empty.csv' is empty: it has no CSV header"):
        attnprobe.read_csv(empty)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"other.csv' is not an attnprobe trial table: .*\(its columns: a, b\)"):
        attnprobe.read_csv(other)
    with pytest.raises(ValueError, match=r"the DataFrame is not an attnprobe trial table: .*\(its columns: a, b\)"):
        attnprobe.summarize(pd.DataFrame({"a": [1], "b": [2]}))


def test_device_and_metric_names_are_refused_in_python_terms():
    # The core's messages named the CLI's options (--device tpu, "in --metrics") to a Python caller.
    q = np.random.default_rng(1).standard_normal((8, 4))
    with pytest.raises(ValueError, match="unknown metric 'angel': use 'all'") as refused:
        attnprobe.metrics(q, q, "angel")
    assert "--" not in str(refused.value)
    with pytest.raises(ValueError, match="device='tpu': use 'cpu' or 'cuda'"):
        attnprobe.estimate("vmean", q, q, q, device="tpu")
    with pytest.raises(ValueError, match="device='gpu'"):
        attnprobe.sweep(DUMP, "vmean", device="gpu", **SLICE)


def test_cuda_without_a_gpu_is_refused_in_python_terms():
    # The core's message said "--device cuda: ... Use --device cpu" to a Python caller.
    built, problem = attnprobe._core.device_status("cuda")
    if built and not problem:
        pytest.skip("a GPU is visible: device='cuda' runs (the C++ parity tests check it)")
    q = np.random.default_rng(2).standard_normal((8, 4))
    for call in (lambda: attnprobe.estimate("vmean", q, q, q, device="cuda"),
                 lambda: attnprobe.sweep(DUMP, "vmean", device="cuda", **SLICE)):
        with pytest.raises((ValueError, attnprobe.InputError), match="device='cuda'") as refused:
            call()
        assert "--device" not in str(refused.value)
        assert "device='cpu'" in str(refused.value)


def test_metrics_docstring_example_prints_what_it_computes():
    # The example's printed dict had gone stale (spec_rel 1.1594110 against 1.1594108 computed) as the
    # draws' rounding changed; this keeps it true.
    doc = attnprobe.metrics.__doc__
    shown = ast.literal_eval(doc.split('["spec_rel", "angle"])')[1].strip().splitlines()[0])
    q, k, v, scale, _ = attnprobe.load(DUMP, 0, 1, 0, length=128)
    est = attnprobe.estimate("performer(M=64)", q, k, v, scale, seed=0)
    got = attnprobe.metrics(attnprobe.exact(q, k, v, scale), est, ["spec_rel", "angle"])
    assert got == pytest.approx(shown, rel=1e-12), (got, shown)


def test_sweep_queries_and_window_mask_are_the_clis(tmp_path):
    # sweep(mask="window:W", queries=[...]) writes the CLI's rows, number for number; a last:W case is
    # another case (its queries column) with the all case's draws; an estimator without a decode form
    # is refused naming those with one.
    args = dict(layers="1", heads="1", batch="1", lengths=[64, 96], trials=2, seed=SEED, metrics="spec_rel,row_tv")
    df = attnprobe.sweep(DUMP, ["vmean", "uniform_keys(b=8)", "softmax"], mask="window:24",
                         queries=["all", "last:16"], **args)
    cli("sweep", DUMP, "-e", "vmean", "-e", "uniform_keys(b=8)", "-e", "softmax", "--mask", "window:24",
        "--queries", "all,last:16", "--layers", "1", "--heads", "1", "--batch", "1", "--lengths", "64,96",
        "--trials", "2", "--seed", str(SEED), "--metrics", "spec_rel,row_tv", "-q", "-o", str(tmp_path / "w.csv"))
    rows = attnprobe.read_csv(tmp_path / "w.csv")
    assert list(df.columns) == list(rows.columns)
    assert set(df["queries"]) == {"all", "last:16"} and set(df["mask"]) == {"window:24"}
    assert df["value"].tolist() == rows["value"].tolist()
    with pytest.raises(ValueError, match="no decode form"):
        attnprobe.sweep(DUMP, ["nystrom"], queries="last:4", **args)
    with pytest.raises(ValueError, match="last:W"):
        attnprobe.sweep(DUMP, ["vmean"], queries="first:4", **args)


def masked_attention(q, k, v, scale, positions, mask):
    """Softmax attention in float64 numpy, written apart from the library: query row i at key position
    positions[i] (None: cross-attention, every key) sees keys 0..t (causal), t-W+1..t (window:W) or all."""
    logits = scale * q @ k.T
    keys = np.arange(k.shape[0])
    if mask != "full":
        t = np.asarray(positions)[:, None]
        width = int(mask.split(":")[1]) if mask.startswith("window:") else k.shape[0] + 1
        logits[(keys[None, :] > t) | (keys[None, :] <= t - width)] = -np.inf
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


def test_decode_exact_matches_numpy():
    # exact() with fewer queries than keys (n_q = 1, 7 against n_k = 97, p = 50): bottom-right causal and
    # window rows, explicit q_positions, and cross-attention, against masked_attention to 1e-12 in float64
    # and within float32 rounding for dtype=float32. Seed 11.
    rng = np.random.default_rng(11)
    n_k, p, scale = 97, 50, 0.2
    q, k, v = rng.normal(size=(n_k, p)), rng.normal(size=(n_k, p)), rng.normal(size=(n_k, p))
    worst64 = worst32 = 0.0
    for n_q in (1, 7):
        last = q[-n_q:]
        bottom_right = np.arange(n_k - n_q, n_k)
        explicit = np.array([3, 10, 11, 40, 41, 80, 96][-n_q:])
        cases = [(dict(mask="causal"), last, bottom_right, "causal"),
                 (dict(causal=True), last, bottom_right, "causal"),
                 (dict(mask="window:20"), last, bottom_right, "window:20"),
                 (dict(mask="full"), last, bottom_right, "full"),
                 (dict(mask="causal", q_positions=explicit), q[explicit], explicit, "causal"),
                 (dict(mask="window:20", q_positions=list(explicit)), q[explicit], explicit, "window:20"),
                 (dict(cross=True), rng.normal(size=(n_q, p)), None, "full")]
        for kwargs, rows, positions, mask in cases:
            want = masked_attention(rows, k, v, scale, positions, mask)
            got = attnprobe.exact(rows, k, v, scale, **kwargs)
            assert got.shape == (n_q, p)
            worst64 = max(worst64, np.abs(got - want).max())
            got32 = attnprobe.exact(rows, k, v, scale, dtype=np.float32, **kwargs)
            worst32 = max(worst32, np.abs(got32 - want).max())
    assert worst64 < 1e-12  # observed 1.2e-15
    # float32 rounds inputs, scores and sums: a few units of 6e-8 on outputs up to 1.6.
    assert worst32 < 4e-6  # observed 5.2e-7
    # A window row sees only its window: the keys before it do not change it.
    row = attnprobe.exact(q[-1:], k, v, scale, mask="window:20")
    k2, v2 = k.copy(), v.copy()
    k2[:n_k - 20], v2[:n_k - 20] = 0, 0
    assert np.array_equal(row, attnprobe.exact(q[-1:], k2, v2, scale, mask="window:20"))
    # Cross-attention takes any number of keys, fewer than the queries too.
    few = attnprobe.exact(q[:7], k[:3], v[:3], scale, cross=True)
    assert np.abs(few - masked_attention(q[:7], k[:3], v[:3], scale, None, "full")).max() < 1e-12
    # The last rows of the whole slice are the decode rows: bit for bit in float32, whose blocks are aligned to
    # absolute positions (exact_attention.h); float64's row blocks start at the first row evaluated.
    whole = attnprobe.exact(q, k, v, scale, mask="causal", dtype=np.float32)
    assert np.array_equal(whole[-7:], attnprobe.exact(q[-7:], k, v, scale, mask="causal", dtype=np.float32))
    whole = attnprobe.exact(q, k, v, scale, mask="causal")
    assert np.abs(whole[-7:] - attnprobe.exact(q[-7:], k, v, scale, mask="causal")).max() < 1e-14  # observed 4.2e-16


def test_decode_estimates_match_the_cli_and_the_whole_slice(tmp_path):
    # Every estimator with a causal decode form (estimators()' "decode"): estimate() of the last 16 rows
    # against all 96 keys with a --queries last:16 row as its case gives the CLI's metrics bit for bit,
    # and the very bits of the last 16 rows of the whole slice's estimate (the draws are the all case's).
    # (Not those anchored at the prompt boundary: their decode rows depend on where the prompt ends, by design.)
    specs = [e["spec"] for e in attnprobe.estimators()
             if "causal" in e["decode"] and not e["prompt"] and not e["anchored"]]
    assert "softmax" in specs and not any(s.startswith("nystrom") for s in specs)
    out = tmp_path / "decode.csv"
    cli("sweep", DUMP, "--layers", "1", "--heads", "1", "--batch", "1", "--lengths", "96", "--trials", "2",
        "--seed", str(SEED), "--mask", "causal", "--queries", "last:16", "-q", "-o", str(out),
        *[a for s in specs for a in ("-e", s)])
    rows = attnprobe.read_csv(out)
    assert set(rows["queries"]) == {"last:16"} and set(rows["n"]) == {96}
    q, k, v, scale, _ = attnprobe.load(DUMP, 1, 1, 1, length=96)
    step = attnprobe.Slice(q[-16:], k, v, scale, mask="causal")
    checked = set()
    for (spec, ref, trial), group in rows.groupby(["spec", "reference", "trial"], sort=False):
        case = group.iloc[0]
        reference = attnprobe.reference(ref, q[-16:], k, v, scale, mask="causal")
        est = attnprobe.estimate(spec, q[-16:], k, v, scale, mask="causal", case=case, seed=SEED, trial=int(trial))
        values = attnprobe.metrics(reference, est, list(group["metric"]))
        for metric, value in zip(group["metric"], group["value"]):
            assert same(values[metric], value), (spec, trial, metric, values[metric], value)
        whole = attnprobe.estimate(spec, q, k, v, scale, causal=True, seed=SEED, trial=int(trial),
                                   case={"layer": 1, "head": 1, "batch": 1})
        assert np.array_equal(est, whole[-16:]), spec
        assert np.array_equal(est, attnprobe.estimate(spec, step, case=case, seed=SEED, trial=int(trial))), spec
        checked.add(spec)
    assert checked == {attnprobe._core.canonical(s) for s in specs}
    # The case id carries the geometry as the sweep's; the key leaves the queries part out.
    assert attnprobe.case_id(1, 1, 1, 96, "softmax", mask="causal", queries="last:16") == \
        "layer=1;head=1;batch=1;n=96;spec=softmax;mask=causal;queries=last:16"
    assert attnprobe.case_id(1, 1, 1, 96, "softmax", mask="window:8") == \
        "layer=1;head=1;batch=1;n=96;spec=softmax;mask=window:8"


def test_prompt_estimators_sweep_decode_rows_as_the_cli(tmp_path):
    # snapkv compresses the cache from the prompt's query rows: sweep(queries="last:W") reads them from the dump's
    # slice, as the CLI does, bit for bit; a decode slice handed to estimate() holds no prompt (InputError).
    specs = cli("list", "--variants", "--prompt").stdout.split()  # decode rows only
    assert any(s.startswith("snapkv") for s in specs)
    out = tmp_path / "prompt.csv"
    args = ["sweep", DUMP, "--layers", "1", "--heads", "1", "--batch", "1", "--lengths", "96", "--mask", "causal",
            "--queries", "last:16", "--metrics", "spec_rel,selection", "-q", "-o", str(out)]
    cli(*args, *[a for s in specs for a in ("-e", s)])
    mine = attnprobe.sweep(DUMP, specs, layers="1", heads="1", batch="1", lengths=[96], mask="causal",
                           queries="last:16", metrics="spec_rel,selection")
    theirs = attnprobe.read_csv(out)
    assert len(mine) == len(theirs) > 0
    assert np.array_equal(mine["value"].to_numpy(), theirs["value"].to_numpy(), equal_nan=True)
    q, k, v, scale, _ = attnprobe.load(DUMP, 1, 1, 1, length=96)
    with pytest.raises(attnprobe.InputError, match="needs the query rows of the prompt"):
        attnprobe.estimate(specs[0], q[-16:], k, v, scale, mask="causal")
    with pytest.raises(ValueError, match="--queries last:W"):
        attnprobe.sweep(DUMP, specs[:1], layers="1", heads="1", batch="1", lengths=[96], mask="causal")


def test_rotary_frequencies_travel_with_layers_slices_writers_and_sweeps(tmp_path):
    # expected(stats=rope) reads a layer's rope_inv_freq (docs/dumps.md, "Rotary frequencies"). A causal GQA layer
    # written with them by each container, swept from memory as a Layer and as a Slice, gives the CLI's numbers from
    # the written file; without them the CLI refuses the setting, naming the array.
    rng = np.random.default_rng(3)
    p, n = 16, 96
    q = rng.standard_normal((1, 4, n, p)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, n, p)).astype(np.float32) for _ in range(2))
    freq = 10000.0 ** (-np.arange(p // 2) * 2 / p)
    layer = attnprobe.Layer(q=q, k=k, v=v, causal=1, rope_inv_freq=freq)
    specs = cli("list", "--variants", "--prompt", "--rotary").stdout.split()
    assert specs and all("stats=rope" in s for s in specs)
    options = dict(lengths=[n], queries="last:16", mask="causal", trials=1, metrics="spec_rel,selection")
    rows = []
    for name in ("rope.h5", "rope.safetensors", "rope.npz"):
        layer.write(tmp_path / name)
        out = tmp_path / (name + ".csv")
        cli("sweep", str(tmp_path / name), "--lengths", str(n), "--queries", "last:16", "--mask", "causal",
            "--trials", "1", "--metrics", "spec_rel,selection", "-q", "-o", str(out),
            *[a for s in specs for a in ("-e", s)])
        table = attnprobe.read_csv(out)
        assert np.isfinite(table[table["metric"] == "spec_rel"]["value"]).all() and len(table) > 0
        rows.append(table["value"].to_numpy())
    for other in rows[1:]:
        assert np.array_equal(rows[0], other, equal_nan=True)  # the three containers carry the same frequencies
    memory = attnprobe.sweep({"layer_00": layer}, specs, **options)
    assert np.array_equal(memory["value"].to_numpy(), rows[0], equal_nan=True)
    # A Slice carries them too (Layer.slice, load(as_slice=True)), and a sweep of it keeps them.
    head = layer.slice(head=3)
    assert np.array_equal(head.rope_inv_freq, freq)
    loaded = attnprobe.load(tmp_path / "rope.h5", 0, 3, 0, as_slice=True)
    assert np.array_equal(loaded.rope_inv_freq, freq)
    one = attnprobe.sweep({"layer_00": head}, specs, **options)  # head 3 alone: its kv group is itself
    alone = attnprobe.Layer(q=q[:, 3:4], k=k[:, 1:2], v=v[:, 1:2], causal=1, rope_inv_freq=freq)
    assert np.array_equal(one["value"].to_numpy(), attnprobe.sweep({"layer_00": alone}, specs, **options)[
        "value"].to_numpy(), equal_nan=True)
    # Without them: the CLI and the Python sweep refuse, saying where they go.
    attnprobe.Layer(q=q, k=k, v=v, causal=1).write(tmp_path / "plain.h5")
    result = subprocess.run([BINARY, "sweep", str(tmp_path / "plain.h5"), "-e", specs[0], "--queries", "last:16",
                             "--mask", "causal", "-q", "-o", str(tmp_path / "plain.csv")], capture_output=True,
                            text=True)
    assert result.returncode == 3 and "rope_inv_freq" in result.stderr, result.stderr
    with pytest.raises(attnprobe.InputError, match="Slice\\(..., rope_inv_freq=...\\)"):
        attnprobe.sweep({"layer_00": attnprobe.Layer(q=q, k=k, v=v, causal=1)}, specs[:1], **options)
    # Bad frequencies are refused before anything is written or measured.
    with pytest.raises(ValueError, match="rope_inv_freq: 3 values for a head dim of 16"):
        attnprobe.Slice(q[0, 0], k[0, 0], v[0, 0], mask="causal", rope_inv_freq=freq[:3])
    with pytest.raises(ValueError, match="rope_inv_freq: \\[2\\] = -1 is not an inverse frequency"):
        attnprobe.Slice(q[0, 0], k[0, 0], v[0, 0], mask="causal", rope_inv_freq=np.where(np.arange(8) == 2, -1, freq))
    with pytest.raises(ValueError, match="cross-attention queries have no positions"):
        attnprobe.Slice(q[0, 0], k[0, 0], v[0, 0], cross=True, rope_inv_freq=freq)
    for bad, message in ((freq[:5], "must be 8 floats"), (np.where(np.arange(8) == 1, np.inf, freq), "not inverse")):
        with pytest.raises(ValueError, match=message):
            attnprobe.Layer(q=q, k=k, v=v, causal=1, rope_inv_freq=bad).write(tmp_path / "bad.npz")
        assert not (tmp_path / "bad.npz").exists()


def test_decode_refusals_say_what_to_do():
    q, k, v, scale, _ = attnprobe.load(DUMP, 0, 0, 0, length=64)
    last = q[-4:]
    with pytest.raises(ValueError, match="'nystrom.*' has no decode form under the full mask.*estimators with one:.*"
                                         "softmax"):
        attnprobe.estimate("nystrom", last, k, v, scale)
    with pytest.raises(ValueError, match="no decode form"):
        attnprobe.reference("nystrom", last, k, v, scale)
    bad = [([60, 62, 61, 63], ValueError, r"q_positions\[2\] = 61 follows q_positions\[1\] = 62: positions must be "
                                          "strictly increasing"),
           ([60, 61, 62, 64], ValueError, r"q_positions\[3\] = 64 is not a key position \(0..63"),
           ([-1, 61, 62, 63], ValueError, r"q_positions\[0\] = -1 is not a key position"),
           ([61, 62, 63], ValueError, "q_positions has 3 entries but q has 4 rows"),
           (np.array([60.0, 61, 62, 63]), TypeError, "q_positions must hold integers"),
           (np.array([60, np.nan, 62, 63]), ValueError, r"q_positions\[1\] is NaN"),
           (np.array([[60, 61, 62, 63]]), ValueError, "q_positions must be 1-D")]
    for positions, error, message in bad:
        with pytest.raises(error, match=message):
            attnprobe.exact(last, k, v, scale, mask="causal", q_positions=positions)
    with pytest.raises(ValueError, match="cross=True with mask='causal'.*only mask='full'"):
        attnprobe.exact(last, k, v, scale, causal=True, cross=True)
    with pytest.raises(ValueError, match="cross=True with q_positions"):
        attnprobe.estimate("softmax", last, k, v, scale, cross=True, q_positions=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="contradict"):
        attnprobe.exact(last, k, v, scale, causal=True, mask="window:8")
    with pytest.raises(ValueError, match="mask='window:0': use 'full', 'causal' or 'window:W'"):
        attnprobe.exact(last, k, v, scale, mask="window:0")
    with pytest.raises(ValueError, match="case has n=96 but k has 64 rows"):
        attnprobe.estimate("softmax", last, k, v, scale, case={"layer": 0, "head": 0, "batch": 0, "n": 96})
    with pytest.raises(ValueError, match="case has queries=last:16 but q has 4 rows"):
        attnprobe.estimate("softmax", last, k, v, scale, mask="causal",
                           case={"layer": 0, "head": 0, "batch": 0, "mask": "causal", "queries": "last:16"})
    with pytest.raises(ValueError, match="pass mask='causal'"):
        attnprobe.estimate("softmax", last, k, v, scale, case={"layer": 0, "head": 0, "batch": 0, "mask": "causal"})
    # Custom Python estimators declare no decode form.
    with pytest.raises(ValueError, match="no decode form"):
        attnprobe.sweep(DUMP, [], custom={"mine": exact_softmax}, layers=0, heads=0, batch=0, lengths=[16],
                        queries="last:4")


def test_slice_carries_the_decode_geometry():
    q, k, v, scale, _ = attnprobe.load(DUMP, 0, 1, 0, length=80)
    positions = np.array([5, 30, 31, 79])
    s = attnprobe.Slice(q[positions], k, v, scale, mask="window:16", q_positions=positions)
    assert (s.n, s.keys, s.mask, s.causal, s.cross) == (4, 80, "window:16", False, False)
    assert s.q_positions.tolist() == positions.tolist()
    assert np.array_equal(attnprobe.exact(s), attnprobe.exact(q[positions], k, v, scale, mask="window:16",
                                                              q_positions=positions))
    assert np.array_equal(attnprobe.estimate("uniform_keys(b=8)", s, seed=3),
                          attnprobe.estimate("uniform_keys(b=8)", q[positions], k, v, scale, mask="window:16",
                                             q_positions=positions, seed=3))
    assert attnprobe.Slice(q[-3:], k, v, scale).q_positions.tolist() == [77, 78, 79]  # bottom-right
    cross = attnprobe.Slice(q[:3], k[:50], v[:50], scale, cross=True)
    assert (cross.n, cross.keys, cross.mask, cross.cross, cross.q_positions) == (3, 50, "full", True, None)
    with pytest.raises(ValueError, match="carries its geometry"):
        attnprobe.exact(s, mask="causal")
    with pytest.raises(ValueError, match="carries its geometry"):
        attnprobe.estimate("softmax", s, q_positions=positions)


def test_head_column_is_read_with_brackets():
    """The `head` column shares its name with DataFrame.head (docs/python.md): brackets and query() select it."""
    df = attnprobe.sweep(DUMP, ["vmean"], layers=0, heads="0,1", batch=0, lengths=[64], trials=1,
                         metrics="spec_rel")
    assert callable(df.head)  # the attribute is pandas' method, not the column
    assert sorted(df["head"].unique()) == [0, 1]
    assert len(df[df["head"] == 1]) == len(df.query("head == 1")) == len(df) // 2 > 0


def test_estimate_returns_the_reference_the_cli_measures_against(cli_csv):
    """return_reference=True gives the reference a sweep uses under --reference auto (yoso's is yoso-e, not exact
    attention), so the metrics of the returned pair are the CSV's, bit for bit; against exact() they differ."""
    q, k, v, scale, _ = attnprobe.load(DUMP, 1, 1, 1, length=96)
    rows = attnprobe.read_csv(cli_csv["full"])
    for spec in ["yoso(m=32,tau=8,hash=gauss,norm=l2,input=l2,grad=lsh)", "performer(M=64,ortho=1)"]:
        group = rows[(rows.spec == spec) & (rows.trial == 1) & (rows.metric == "spec_rel")]
        assert len(group) == 1, spec
        est, ref, ref_spec = attnprobe.estimate(spec, q, k, v, scale, seed=SEED, trial=1, case=group.iloc[0],
                                                return_reference=True)
        assert ref_spec == group.iloc[0]["reference"]
        assert attnprobe.metrics(ref, est)["spec_rel"] == group.iloc[0]["value"]
        assert np.array_equal(est, attnprobe.estimate(spec, q, k, v, scale, seed=SEED, trial=1, case=group.iloc[0]))
    assert ref_spec == "softmax"  # performer's
    yoso = attnprobe.estimate("yoso", q, k, v, scale, return_reference=True)
    assert yoso.reference_spec.startswith("yoso-e(")
    exact_error = attnprobe.metrics(attnprobe.exact(q, k, v, scale), yoso.estimate)["spec_rel"]
    assert exact_error != attnprobe.metrics(yoso.reference, yoso.estimate)["spec_rel"]


def test_compare_equals_the_cli(tmp_path):
    """attnprobe.compare is `summarize --compare`: the same rows, from a DataFrame or the CSV, specs typed briefly."""
    import io

    csv_path = tmp_path / "sweep.csv"
    cli("sweep", DUMP, "-e", "performer(M=16)", "-e", "nystrom(L=16)", "--layers", "0,1", "--heads", "0,1",
        "--batch", "0,1", "--lengths", "64", "--trials", "3", "--metrics", "spec_rel,angle", "-q", "-o", str(csv_path))
    text = cli("summarize", str(csv_path), "--compare", "performer(M=16)", "nystrom(L=16)").stdout
    expected = pd.read_csv(io.StringIO(text), float_precision="round_trip", keep_default_na=False)
    got = attnprobe.compare(attnprobe.read_csv(csv_path), "performer(M=16)", "nystrom(L=16)")
    pd.testing.assert_frame_equal(got, attnprobe.compare(str(csv_path), "performer(M=16,ortho=1)", "nystrom(L=16)"),
                                  check_exact=True)
    assert list(got.columns) == list(expected.columns)
    assert len(got) == len(expected) == 2  # spec_rel and angle
    numbers = [c for c in got.columns if c not in ("dump", "mask", "queries", "reference", "metric", "a", "b")]
    assert (got[numbers].to_numpy() == expected[numbers].to_numpy()).all()  # bit for bit
    row = got[got.metric == "spec_rel"].iloc[0]
    assert row["heads"] == 4 and row["slices"] == 8  # 2 layers × 2 heads, 2 batch items each
    assert row["a_better"] + row["b_better"] + row["ties"] == 4
    with pytest.raises(ValueError, match="no row has the spec"):
        attnprobe.compare(str(csv_path), "performer(M=16)", "yoso(m=8)")
