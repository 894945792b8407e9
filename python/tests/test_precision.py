"""pytest of the precision modes (docs/precision.md) against precision_emulation.py, the numpy emulation written from
the rules (its own tests: test_precision_emulation.py).

What it shows: attnprobe.round_to is the emulation's rounding bit for bit; exact(precision="bf16"|"f16") and
estimate("softmax", precision=...) are the emulation's FlashAttention-2 forward bit for bit (float32 bit patterns,
inf included; NaN where the emulation has NaN) under the full, causal and window masks, in self-attention and
decode geometries; and the CLI's round_floor on slices of the real dumps in ../shared/data (skipped without them)
is the emulation's to 1e-12. Fixed seeds throughout.

Why bit for bit and not a tolerance: the rules fix every rounding point and make each float32 accumulation wider and
rounded once, so the order in which attnprobe sums cannot show in a float32 result unless a float64 rounding error
crosses a float32 rounding boundary (a chance of ~n·2^-29 per sum; test_precision_emulation.py's
test_float32_results_do_not_depend_on_the_float64_summation_order_or_exp found none in 1.6M sums). The same holds
for the float64 exp, whose last bit differs between libm and numpy but which rounds to the same float32.
"""
import math
import os
import subprocess

import numpy as np
import pandas as pd
import pytest

import attnprobe
from precision_emulation import edge_values, exact_rounded, random_values, round_floor, round_to, same_bits

SOURCE = os.environ.get("ATTNPROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("ATTNPROBE", os.path.join(SOURCE, "build", "attnprobe"))
SHARED_DATA = os.environ.get("ATTNPROBE_SHARED_DATA", os.path.join(SOURCE, "..", "shared", "data"))
ROUNDED = ["bf16", "f16"]
MASKS = ["full", "causal", "window:5"]


def assert_same_bits(got, want, what):
    """got (attnprobe's) is a float32 array with want's bit patterns; NaN where want has NaN, any payload (the rules
    place NaN, not its sign or payload: x86's inf − inf is a negative NaN, a canonicalising conversion positive)."""
    got = np.asarray(got)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}, expected float32"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if same_bits(got, want):
        return
    differ = np.argwhere((got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want)))
    first = tuple(differ[0])
    def ordered(x):  # float32 bits as integers in the order of the values (−0 = +0), one apart per ulp
        magnitude = (x.view(np.uint32) & np.uint32(0x7FFFFFFF)).astype(np.int64)
        return np.where(np.signbit(x), -magnitude, magnitude)
    ulps = np.abs(ordered(got) - ordered(want))[tuple(differ.T)]
    pytest.fail(f"{what}: {len(differ)} of {got.size} values differ, the first at {first}: {got[first]!r} against "
                f"the emulation's {want[first]!r}; float32 ulps apart at most {ulps.max()}")


def inputs(seed, n_k, p, pv=None, n_q=None, sharpness=1.5):
    """float32-valued q (n_q × p, default n_k rows), k (n_k × p), v (n_k × pv) and 1/√p, as a dump's slice is: q's
    sharpness scales the scores (1.5: a few units; 4: peaked rows, most weights below 2^-29, many P̃ that round
    to fp16 subnormals or 0)."""
    rng = np.random.default_rng(seed)
    q = (sharpness * rng.standard_normal((n_k if n_q is None else n_q, p))).astype(np.float32)
    k = rng.standard_normal((n_k, p)).astype(np.float32)
    v = rng.standard_normal((n_k, p if pv is None else pv)).astype(np.float32)
    return q, k, v, 1 / math.sqrt(p)


# ---- round_to -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["f32", "bf16", "f16"])
def test_round_to_equals_the_emulation_bit_for_bit(precision):
    for what, values in (("edge values", edge_values()), ("random values", random_values(seed=11)),
                         ("a 2-D array", random_values(seed=12, count=3000).reshape(100, 90))):
        assert_same_bits(attnprobe.round_to(values, precision), round_to(values, precision), f"{precision} {what}")
    # float64 input is converted to float32 first (the contract): normal draws, whose float32 is a tie of ℓ once
    # in ~2^17, plus the values of test_round_to_converts_to_float32_first, each a tie only after that conversion.
    doubles = np.concatenate([np.random.default_rng(13).standard_normal(100_000),
                              [1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -11 + 2 ** -30]])
    assert_same_bits(attnprobe.round_to(doubles, precision), round_to(doubles, precision), f"{precision} doubles")
    assert float(attnprobe.round_to(np.float64(1 + 2 ** -8 + 2 ** -30), "bf16")) == 1.0


# ---- exact() and estimate("softmax") ---------------------------------------------------------------------------

# (seed, n_k, p, pv, sharpness): p = 16..128, up to 600 keys, pv ≠ p once, peaked rows once.
SLICES = [(0, 64, 16, 16, 1.5), (1, 257, 64, 32, 1.5), (2, 600, 128, 128, 1.5), (3, 300, 32, 32, 4.0)]


@pytest.mark.parametrize("slice_", SLICES, ids=lambda s: f"seed{s[0]}-n{s[1]}-p{s[2]}-pv{s[3]}-sharp{s[4]}")
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("precision", ROUNDED)
def test_exact_and_the_softmax_estimate_equal_the_emulation_bit_for_bit(precision, mask, slice_):
    seed, n, p, pv, sharpness = slice_
    q, k, v, scale = inputs(seed, n, p, pv, sharpness=sharpness)
    want = exact_rounded(q, k, v, scale, precision, mask)
    assert_same_bits(attnprobe.exact(q, k, v, scale, mask=mask, precision=precision), want, "exact")
    assert_same_bits(attnprobe.estimate("softmax", q, k, v, scale, mask=mask, precision=precision), want,
                     "estimate('softmax')")


@pytest.mark.parametrize("positions", [None, [0, 57, 58, 250]], ids=["bottom-right", "explicit"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("precision", ROUNDED)
def test_decode_rows_equal_the_emulation_bit_for_bit(precision, mask, positions):
    # 4 query rows against a 300-key cache: by default at positions 296..299, else at chosen ones (position 0 sees
    # one key under the causal and window masks: its row is v_0 rounded).
    q, k, v, scale = inputs(21, 300, 64, n_q=4)
    want = exact_rounded(q, k, v, scale, precision, mask, q_positions=positions)
    got = attnprobe.exact(q, k, v, scale, mask=mask, q_positions=positions, precision=precision)
    assert_same_bits(got, want, "exact, decode rows")
    assert_same_bits(attnprobe.estimate("softmax", q, k, v, scale, mask=mask, q_positions=positions,
                                        precision=precision), want, "estimate('softmax'), decode rows")
    if positions is not None and mask != "full":
        assert np.array_equal(got[0], round_to(v[0], precision))


def test_non_finite_rows_equal_the_emulation():
    """Rows the rules make infinite or NaN through IEEE arithmetic at the stated points (none passes a NaN to the
    row max, whose NaN handling the rules leave open)."""
    q, k, v, scale = inputs(31, 40, 16, sharpness=0.3)
    large = (7e4 + 1e3 * v).astype(np.float32)  # ≥ 6.7e4: inf in fp16, finite in bf16
    cases = {
        # Every visible P̃ > 0 times +inf values: +inf in every row (fp16); finite in bf16.
        "values beyond 65504": (q, large, "causal"),
        # Peaked rows: some visible P̃ round to 0 in fp16, and 0·inf = NaN enters every row's sum.
        "0·inf in P̃·v": (40 * q, large, "full"),
    }
    overflowing_q = q.copy()
    overflowing_q[3, 5] = 1e5  # inf in fp16: row 3's scores are ±inf, its max +inf, +inf − +inf = NaN: a NaN row
    cases["a query beyond 65504"] = (overflowing_q, v, "full")
    for what, (queries, values, mask) in cases.items():
        for precision in ROUNDED:
            want = exact_rounded(queries, k, values, scale, precision, mask)
            got = attnprobe.exact(queries, k, values, scale, mask=mask, precision=precision)
            assert_same_bits(got, want, f"{what}, {precision}")
            if precision == "bf16":
                assert np.isfinite(got).all()
    # What the emulation gives, for the reader (and so that the cases above test what they claim).
    assert np.isposinf(exact_rounded(q, k, large, scale, "f16", "causal")).all()
    assert np.isnan(exact_rounded(40 * q, k, large, scale, "f16", "full")).all()
    rows = np.isnan(exact_rounded(overflowing_q, k, v, scale, "f16", "full")).all(axis=1)
    assert rows.tolist() == [i == 3 for i in range(40)]


def ties_after_float32(seed, shape, precision):
    """float64 values a hair above a midpoint of ℓ: their float32 is the midpoint itself (the hair, 2^-30 of a
    ulp of ℓ, is below float32's resolution), which rounds to even, while a direct rounding would go up."""
    rng = np.random.default_rng(seed)
    magnitude = 0.5 + np.abs(rng.standard_normal(shape))  # normal in both formats, so the ulp below is right
    base = round_to(np.where(rng.random(shape) < 0.5, -magnitude, magnitude), precision).astype(np.float64)
    _, exponent = np.frexp(base)
    ulp = np.ldexp(1.0, exponent - (8 if precision == "bf16" else 11))
    return base + np.sign(base) * 0.5 * ulp * (1 + 2.0 ** -30), base + np.sign(base) * ulp


@pytest.mark.parametrize("precision", ROUNDED)
def test_exact_rounds_float64_inputs_through_float32(precision):
    """The rules round q, k, v "to ℓ", and round_to converts to float32 first; exact() is held to the same (the
    emulation rounds its float64 inputs with round_to). Inputs built so that the two readings differ: each value's
    direct rounding is one ulp of ℓ above its rounding through float32 in about half the entries."""
    (q, q_up), (k, k_up), (v, v_up) = (ties_after_float32(40 + i, (96, 32), precision) for i in range(3))
    assert 0.4 < np.mean(round_to(q, precision) != q_up) < 0.6  # observed ~0.5: ties to even go down half the time
    scale = 1 / math.sqrt(32)
    want = exact_rounded(q, k, v, scale, precision, "causal")
    assert_same_bits(attnprobe.exact(q, k, v, scale, mask="causal", precision=precision), want, "float64 inputs")
    direct = exact_rounded(np.where(round_to(q, precision) != q_up, q_up, q),
                           np.where(round_to(k, precision) != k_up, k_up, k),
                           np.where(round_to(v, precision) != v_up, v_up, v), scale, precision, "causal")
    assert not same_bits(direct, want)  # the other reading gives other bits: the test can tell them apart


# ---- the CLI's round_floor on real dumps --------------------------------------------------------------------------

# (file, layer, head, batch, length or None for the item's whole valid length, mask): stories260K (Llama, p = 8,
# peaked causal attention) at 256 of its 512 tokens, and KWT-1 (p = 64, diffuse full attention, 99 tokens).
DUMP_SLICES = [("stories260K.h5", 0, 0, 0, 256, "causal"), ("kwt1-speech.h5", 0, 0, 0, None, "full")]


@pytest.mark.parametrize("dump_slice", DUMP_SLICES, ids=[s[0] for s in DUMP_SLICES])
def test_cli_round_floor_equals_the_emulation(dump_slice, tmp_path):
    name, layer, head, batch, length, mask = dump_slice
    dump = os.path.join(SHARED_DATA, name)
    if not os.path.exists(dump):
        pytest.skip(f"{dump} is absent (the shared dumps of ../shared/data/README.md)")
    csv = tmp_path / "eval.csv"
    args = [BINARY, "eval", dump, "-e", "softmax", "--layers", str(layer), "--heads", str(head), "--batch",
            str(batch), "--mask", mask, "--precision", ",".join(ROUNDED), "--metrics", "round_floor", "--threads",
            "2", "-q", "-o", str(csv)]
    if length is not None:
        args += ["--length", str(length)]
    run = subprocess.run(args, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = pd.read_csv(csv, float_precision="round_trip")
    rows = rows[rows["metric"] == "round_floor"]
    q, k, v, scale, _ = attnprobe.load(dump, layer, head, batch, length=length)
    assert set(rows["precision"]) == set(ROUNDED)
    for precision in ROUNDED:
        values = rows.loc[rows["precision"] == precision, "value"]
        want = round_floor(q, k, v, scale, precision, mask)
        # Equal to rounding: R_ℓ is the same bits; R* and the norms are float64 sums in another order. The
        # emulation's floors: stories260K bf16 7.7e-3, f16 9.2e-4; kwt1 bf16 1.8e-3, f16 2.1e-4.
        assert len(values) >= 1 and np.abs(values.to_numpy() - want).max() < 1e-12, (precision, list(values), want)


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
