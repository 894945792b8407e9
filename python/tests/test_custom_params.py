"""Custom estimators with parameters (sweep(custom={"name": (fn, {"k": [...]}, {options})}), docs/python.md):
one setting per combination, specs that carry the values, a samples knob, a deterministic flag, draws keyed by
each setting's own case id, resume, and the messages for what cannot be declared."""
import os
import subprocess

import numpy as np
import pytest

import attnprobe

SOURCE = os.environ.get("ATTNPROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("ATTNPROBE", os.path.join(SOURCE, "build", "attnprobe"))
DUMP = os.path.join(SOURCE, "data", "synth-demo.h5")
SLICE = dict(layers=0, heads="0,1", batch=0, lengths=[128], seed=3)


def topk(q, keys, values, scale, causal, seed, k):
    """Softmax over each row's k largest scores (ties kept): deterministic, exact once k >= n."""
    s = scale * q @ keys.T
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    kth = -np.sort(-s, axis=1)[:, min(k, s.shape[1]) - 1:min(k, s.shape[1])]
    s = np.where(s >= kth, s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ values


def exact_softmax(q, k, v, scale, causal, seed):
    s = scale * q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def test_grid_specs_samples_knob_and_deterministic_trials():
    seen = []

    def recorded(q, keys, values, scale, causal, seed, k):
        seen.append((k, type(k), seed))
        return topk(q, keys, values, scale, causal, seed, k)

    df = attnprobe.sweep(DUMP, [], custom={"topk": (recorded, {"k": [4, 16, 64]},
                                                    {"samples": "k", "deterministic": True})},
                         trials=4, metrics="spec_rel", **SLICE)
    assert list(dict.fromkeys(df["spec"])) == ["py:topk(k=4)", "py:topk(k=16)", "py:topk(k=64)"]
    assert set(df["estimator"]) == {"py:topk"}
    assert (df["samples"] == df["spec"].str.extract(r"k=(\d+)")[0].astype(int)).all()
    assert set(df["trial"]) == {0} and len(df) == 3 * 2  # deterministic: one trial per (setting, head)
    # fn got k as the int it was given; the seed is the case's trial-0 key, its own per setting.
    assert {type_ for _, type_, _ in seen} == {int}
    expected = {(k, attnprobe.random_key(3, attnprobe.case_id(0, h, 0, 128, f"py:topk(k={k})"), 0))
                for k in (4, 16, 64) for h in (0, 1)}
    assert {(k, seed) for k, _, seed in seen} == expected and len(expected) == 6
    # spec_rel falls with k. Observed (seed 3, layer 0, n = 128): head 0: 0.109, 0.0197, 0.00198;
    # head 1: 0.104, 0.0161, 0.00193.
    for head in (0, 1):
        values = df[df["head"] == head].set_index("samples")["value"]
        assert values[4] > 3 * values[16] > 9 * values[64] > 0
        assert 0.05 < values[4] < 0.2


def test_random_settings_draw_per_setting_and_grid_order():
    """A random custom estimator runs `trials` trials per setting, each setting keyed by its own case id (as the
    built-ins' settings are); a two-key grid varies its first key slowest; floats and strings print canonically."""
    seen = {}

    def noisy(q, k, v, scale, causal, seed, width, mode):
        seen.setdefault((width, mode), set()).add(seed)
        rng = np.random.default_rng(seed)
        return exact_softmax(q, k, v, scale, causal, seed) + width * rng.standard_normal(v.shape)

    df = attnprobe.sweep(DUMP, [], custom={"noisy": (noisy, {"width": [0.1, 1e-05], "mode": ["a", "b_2"]})},
                         trials=2, metrics="spec_rel", layers=0, heads=0, batch=0, lengths=[64], seed=5)
    assert list(dict.fromkeys(df["spec"])) == [
        "py:noisy(width=0.1,mode=a)", "py:noisy(width=0.1,mode=b_2)",
        "py:noisy(width=1e-05,mode=a)", "py:noisy(width=1e-05,mode=b_2)"]
    assert set(df["trial"]) == {0, 1}
    for (width, mode), seeds in seen.items():
        case = attnprobe.case_id(0, 0, 0, 64, f"py:noisy(width={width!r},mode={mode})")
        assert seeds == {attnprobe.random_key(5, case, t) for t in (0, 1)}
    assert len(set.union(*seen.values())) == 8  # no two settings share a draw
    # The noise is the error: width 0.1 gives a much larger spec_rel than 1e-05.
    by_width = df.groupby(df["spec"].str.contains("width=0.1"))["value"].mean()
    assert by_width[True] > 100 * by_width[False]  # observed 0.0586 against 5.8e-6 (10 000×)


def test_resume_completes_the_same_rows(tmp_path):
    """A sweep stopped by a failing setting (k=16 at n = 64) keeps its finished slice; resume=True with a working
    function computes the rest, equal to a fresh run."""
    def failing(q, keys, values, scale, causal, seed, k):
        if k == 16 and q.shape[0] == 64:
            raise RuntimeError("stop here")
        return topk(q, keys, values, scale, causal, seed, k)

    output = tmp_path / "grid.csv"
    common = dict(trials=2, metrics="spec_rel", layers=0, heads=0, batch=0, lengths=[32, 64], seed=1, threads=1)
    with pytest.raises(attnprobe.EstimatorError, match=r"py:topk\(k=16\)"):
        attnprobe.sweep(DUMP, [], custom={"topk": (failing, {"k": [4, 16]}, {"samples": "k"})}, output=output,
                        **common)
    assert set(attnprobe.read_csv(output)["n"]) == {32}
    custom = {"topk": (topk, {"k": [4, 16]}, {"samples": "k"})}
    done = attnprobe.sweep(DUMP, [], custom=custom, output=output, resume=True, **common)
    fresh = attnprobe.sweep(DUMP, [], custom=custom, **common)
    key = ["n", "spec", "trial"]
    assert len(fresh) == 2 * 2 * 2
    assert done.sort_values(key).reset_index(drop=True)[key + ["seed", "value"]].equals(
        fresh.sort_values(key).reset_index(drop=True)[key + ["seed", "value"]])


def test_summarize_and_slopes_read_the_grid(tmp_path):
    output = tmp_path / "topk.csv"
    df = attnprobe.sweep(DUMP, [], custom={"topk": (topk, {"k": [4, 16, 64]}, {"samples": "k",
                                                                                 "deterministic": True})},
                         metrics="spec_rel", output=output, **SLICE)
    summary = attnprobe.summarize(df, over=["head"])
    assert sorted(summary["spec"]) == ["py:topk(k=16)", "py:topk(k=4)", "py:topk(k=64)"]
    assert (summary["count"] == 2).all()
    if not os.path.exists(BINARY):
        pytest.skip(f"the CLI is not built at {BINARY}")
    slopes = subprocess.run([BINARY, "summarize", str(output), "--slopes"], capture_output=True, text=True,
                            check=True).stdout
    # One fit per head over k = 4, 16, 64. Observed slopes: -1.45 (head 0), -1.44 (head 1).
    rows = [line.split(",") for line in slopes.strip().splitlines()]
    header, rows = rows[0], rows[1:]
    assert len(rows) == 2 and {r[header.index("spec")] for r in rows} == {"py:topk(k=*)"}
    assert all(-2.0 < float(r[header.index("slope")]) < -1.0 for r in rows)


def test_plain_form_and_redeclaration():
    """{"name": fn} is still spec py:name, random; the same name declared again with parameters, then plain again,
    is redefined between sweeps."""
    plain = attnprobe.sweep(DUMP, [], custom={"again": exact_softmax}, trials=2, metrics="spec_rel",
                            layers=0, heads=0, batch=0, lengths=[32])
    assert set(plain["spec"]) == {"py:again"} and set(plain["trial"]) == {0, 1}
    assert plain["samples"].isna().all()  # no knob: the CSV's samples column is empty
    grid = attnprobe.sweep(DUMP, [], custom={"again": (topk, {"k": [8]})}, trials=2, metrics="spec_rel",
                           layers=0, heads=0, batch=0, lengths=[32])
    assert set(grid["spec"]) == {"py:again(k=8)"}
    back = attnprobe.sweep(DUMP, [], custom={"again": exact_softmax}, trials=2, metrics="spec_rel",
                           layers=0, heads=0, batch=0, lengths=[32])
    assert back.equals(plain)


@pytest.mark.parametrize("custom, error, message", [
    ({"t": (topk, {"k": []})}, ValueError, "parameter 'k' has an empty list"),
    ({"t": (topk, {"k": 16})}, TypeError, r"parameter 'k' must be a list of values, e.g. \{'k': \[16\]\}"),
    ({"t": (topk, {"k": "16"})}, TypeError, "must be a list of values"),
    ({"t": (topk, {"2k": [16]})}, ValueError, "'2k' is not a Python identifier"),
    ({"t": (topk, {"k": [16]}, {"samples": "m"})}, ValueError, "samples knob 'm' is not one of the parameters"),
    ({"t": (topk, {"k": [0.5]}, {"samples": "k"})}, ValueError, "integers >= 1; 0.5 is not"),
    ({"t": (topk, {"k": [16]}, {"trials": 1})}, ValueError, "unknown option 'trials'; the options are 'samples'"),
    ({"t": (topk, {"k": [16]}, {"deterministic": "yes"})}, TypeError, "must be True or False"),
    ({"t": 3}, TypeError, "int is not callable"),
    ({"t": (None, {"k": [16]})}, TypeError, "NoneType is not callable"),
    ({"t": (topk,)}, TypeError, "a tuple of 1"),
    ({"t": (topk, {"k": [16, 16]})}, ValueError, "lists 16 more than once"),
    ({"t": (topk, {"k": ["a b"]})}, ValueError, "cannot be printed into a spec"),
    ({"t": (topk, {"k": [float("nan")]})}, ValueError, "not a finite number"),
    ({"t": (topk, {"k": [[1]]})}, TypeError, "a list cannot be printed into a spec"),
    ({"t;x": exact_softmax}, ValueError, "custom name 't;x'"),
    ({"t": (exact_softmax, {"k": [16]})}, TypeError, "cannot be called as fn.*Take the six arguments positionally"),
])
def test_bad_declarations_say_what_to_write(custom, error, message):
    with pytest.raises(error, match=message):
        attnprobe.sweep(DUMP, [], custom=custom, layers=0, heads=0, batch=0, lengths=[16], trials=1)
