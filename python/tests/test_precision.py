"""pytest of the precision modes (docs/precision.md) against an independent numpy emulation.

The emulation below is written from the rounding points of DESIGN §12 / docs/precision.md ("Exact attention:
FlashAttention-2's forward"), not from the C++: rounding to bf16/f16 by bit manipulation (checked against torch's own
conversions), exact attention with q, k, v rounded, S = fl32(fl32(q·k)·fl32(s)), P = fl32(exp(fl32(S − rowmax))), the
row sum and P̃·V (P̃ = P rounded) summed wide and stored once in float32, O = fl32(U / l) rounded. attnprobe must
equal it bit for bit, and the sweep's round_floor on a real dump must equal the emulation's to 1e-12.
"""
import os
import subprocess

import numpy as np
import pandas as pd
import pytest

import attnprobe

try:
    import torch
except ImportError:
    torch = None

SOURCE = os.environ.get("ATTNPROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("ATTNPROBE", os.path.join(SOURCE, "build", "attnprobe"))
SHARED = os.path.join(SOURCE, "..", "shared", "data")


def round_to(x, precision):
    """x (as float32) rounded to nearest, ties to even: bf16 keeps the top 16 bits of the float32 pattern; f16 has
    10 mantissa bits, normal exponents −14..15, subnormals in steps of 2^-24 and overflows to ±inf from 65520."""
    x = np.asarray(x, dtype=np.float32)
    if precision == "f32":
        return x.copy()
    if precision == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x), x, rounded)
    assert precision == "f16"
    a = np.abs(x.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf and NaN inputs are put back below
        exponent = np.floor(np.log2(np.where(a > 0, a, 1.0)))
        quantum = np.exp2(np.maximum(exponent, -14) - 10)
        rounded = np.copysign(np.round(a / quantum) * quantum, x)  # np.round: half to even
    rounded = np.where(a >= 65520, np.copysign(np.inf, x), rounded)
    return np.where(np.isfinite(x), rounded, x).astype(np.float32)


def visible(t, n_k, mask):
    """The keys a query at position t sees: (begin, end)."""
    if mask == "full":
        return 0, n_k
    if mask == "causal":
        return 0, t + 1
    window = int(mask.split(":")[1])
    return max(0, t - window + 1), t + 1


def exact_rounded(q, k, v, scale, precision, mask="full", positions=None):
    q, k, v = (round_to(x, precision).astype(np.float64) for x in (q, k, v))
    n_q, n_k = q.shape[0], k.shape[0]
    positions = np.arange(n_k - n_q, n_k) if positions is None else positions
    out = np.empty((n_q, v.shape[1]), np.float32)
    for i, t in enumerate(positions):
        lo, hi = visible(int(t), n_k, mask)
        dots = (k[lo:hi] @ q[i]).astype(np.float32)  # exact products of 8/11-bit mantissas, summed in float64
        s = dots * np.float32(scale)  # a float32 product
        p = np.exp((s - s.max()).astype(np.float64)).astype(np.float32)  # float32 difference, exp stored in float32
        row_sum = np.float32(p.astype(np.float64).sum())
        u = (round_to(p, precision).astype(np.float64) @ v[lo:hi]).astype(np.float32)
        out[i] = round_to(u / row_sum, precision)
    return out


def exact_f64(q, k, v, scale, mask="full", positions=None):
    n_q, n_k = q.shape[0], k.shape[0]
    positions = np.arange(n_k - n_q, n_k) if positions is None else positions
    out = np.empty((n_q, v.shape[1]))
    for i, t in enumerate(positions):
        lo, hi = visible(int(t), n_k, mask)
        s = scale * (k[lo:hi] @ q[i])
        w = np.exp(s - s.max())
        out[i] = w @ v[lo:hi] / w.sum()
    return out


EDGES = np.array([0.0, -0.0, 1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0,
                  -70000.0, 2**-24, 2**-25, 1.5 * 2**-25, 3.5 * 2**-24, 2**-130, 2**-140, 3.4e38, np.inf, -np.inf,
                  np.nan], dtype=np.float32)


def random_values(seed):
    rng = np.random.default_rng(seed)
    # Every exponent of float32, random mantissas and signs.
    return np.concatenate([EDGES, rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)])


@pytest.mark.skipif(torch is None, reason="torch is not installed (Debian: python3-torch)")
@pytest.mark.parametrize("precision,dtype", [("bf16", "bfloat16"), ("f16", "float16")])
def test_the_emulations_rounding_is_torchs(precision, dtype):
    x = random_values(1)
    ours = round_to(x, precision)
    theirs = torch.from_numpy(x.copy()).to(getattr(torch, dtype)).float().numpy()
    assert np.array_equal(ours, theirs, equal_nan=True)


@pytest.mark.parametrize("precision", ["bf16", "f16", "f32"])
def test_round_to_is_the_emulations_bit_for_bit(precision):
    x = random_values(2)
    got = attnprobe.round_to(x, precision)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32)[~np.isnan(x)], round_to(x, precision).view(np.uint32)[~np.isnan(x)])
    assert np.isnan(got[np.isnan(x)]).all()


@pytest.mark.parametrize("precision", ["bf16", "f16"])
@pytest.mark.parametrize("mask", ["full", "causal", "window:5"])
@pytest.mark.parametrize("p", [16, 64, 128])
def test_exact_in_a_precision_is_the_emulation_bit_for_bit(precision, mask, p):
    rng = np.random.default_rng(p)
    n = 300
    q, k, v = (rng.standard_normal((n, p)) * 1.5 for _ in range(3))
    scale = p ** -0.5
    got = attnprobe.exact(q, k, v, scale, mask=mask, precision=precision)
    want = exact_rounded(q, k, v, scale, precision, mask)
    # Bit for bit: every rounding point is deterministic and each float32 sum is exact or correctly rounded from a
    # float64 sum whose own error (< 1e-15) decides a float32 rounding only on an exact tie (none observed).
    assert np.array_equal(got, want)
    # A decode step (4 rows against the whole cache), default and explicit positions.
    step = attnprobe.exact(q[-4:], k, v, scale, mask=mask, precision=precision)
    assert np.array_equal(step, want[-4:])
    positions = np.array([20, 90, 91, 250])
    placed = attnprobe.exact(q[positions], k, v, scale, mask=mask, q_positions=positions, precision=precision)
    assert np.array_equal(placed, exact_rounded(q[positions], k, v, scale, precision, mask, positions))
    # softmax in the precision is exact attention in it.
    assert np.array_equal(attnprobe.estimate("softmax", q, k, v, scale, mask=mask, precision=precision), got)
    # The floor is of the unit roundoff's order: bf16 2^-8, f16 2^-11 (observed p = 64, full: 5.1e-3 and 5.9e-4).
    ref = exact_f64(q, k, v, scale, mask)
    floor = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert 1e-5 < floor < (1e-2 if precision == "bf16" else 1.5e-3)


def test_f16_overflow_is_a_non_finite_row_not_an_error():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((64, 16)) for _ in range(3))
    v[40, 2] = 1e5  # beyond f16's 65504
    got = attnprobe.exact(q, k, v, 0.25, mask="causal", precision="f16")
    want = exact_rounded(q, k, v, 0.25, "f16", "causal")
    assert np.isfinite(got[:40]).all() and not np.isfinite(got[40]).all()
    assert np.array_equal(got, want, equal_nan=True)
    assert np.isfinite(attnprobe.exact(q, k, v, 0.25, mask="causal", precision="bf16")).all()


def test_estimate_in_a_precision_draws_what_f32_draws():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((256, 32)) for _ in range(3))
    plain = attnprobe.estimate("performer(M=32)", q, k, v, seed=4)
    rounded = attnprobe.estimate("performer(M=32)", q, k, v, seed=4, precision="bf16")
    other_draws = attnprobe.estimate("performer(M=32)", q, k, v, seed=5)
    # Same draws: the bf16 estimate differs from the f32 one by rounding (observed 4.8e-3 relative), far less than
    # another seed's estimate does (observed 1.18).
    near = np.linalg.norm(rounded - plain) / np.linalg.norm(plain)
    far = np.linalg.norm(other_draws - plain) / np.linalg.norm(plain)
    assert near < 0.1 * far
    assert np.array_equal(attnprobe.round_to(rounded, "bf16"), rounded)
    with pytest.raises(ValueError, match="precision"):
        attnprobe.estimate("vmean", q, k, v, precision="fp8")
    case = attnprobe.case_id(0, 1, 0, 64, "vmean", precision="f16")
    assert case == "layer=0;head=1;batch=0;n=64;spec=vmean;precision=f16"


@pytest.mark.skipif(not os.path.exists(os.path.join(SHARED, "stories260K.h5")), reason="../shared/data is absent")
@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_round_floor_of_a_real_dump_is_the_emulations(tmp_path, precision):
    dump = os.path.join(SHARED, "stories260K.h5")
    out = tmp_path / "floor.csv"
    subprocess.run([BINARY, "eval", dump, "-e", "softmax", "--layers", "0,4", "--heads", "0,5", "--batch", "0",
                    "--length", "256", "--mask", "causal", "--precision", precision, "--metrics", "round_floor",
                    "-q", "-o", str(out)], check=True, capture_output=True)
    rows = pd.read_csv(out)
    assert len(rows) == 4 and set(rows["precision"]) == {precision}
    for _, row in rows.iterrows():
        q, k, v, scale, _ = attnprobe.load(dump, int(row["layer"]), int(row["head"]), 0, length=256)
        ref = exact_f64(q, k, v, scale, "causal")
        floor = np.linalg.norm(exact_rounded(q, k, v, scale, precision, "causal") - ref) / np.linalg.norm(ref)
        # Observed: equal to the last digit of the CSV's shortest round-trip text.
        assert abs(row["value"] - floor) < 1e-12, (row["layer"], row["head"], row["value"], floor)
