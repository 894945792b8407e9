"""pytest of precision_emulation.py, the numpy emulation of exact attention in bf16/fp16 (docs/precision.md) that
test_precision.py holds attnprobe to bit for bit. Needs no attnprobe build: its round_to against torch's own
conversions (torch.bfloat16 / torch.float16, skipped without torch), the exact sums' single rounding, the attention's
f32 mode against float64, the size of the bf16 and fp16 rounding floors, and the rows whose value the rules fix
exactly. Fixed seeds throughout.
"""
import math

import numpy as np
import pytest

from precision_emulation import (PRECISIONS, _ExactSum, edge_values, exact_f64, exact_rounded, f32, random_values,
                                 round_floor, round_to, same_bits, visible_keys)

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (Debian: python3-torch)")
TORCH_DTYPE = {"bf16": "bfloat16", "f16": "float16"}


def relative(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


# ---- round_to -------------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_round_to_agrees_with_torch_conversions(precision):
    dtype = getattr(torch, TORCH_DTYPE[precision])
    for values in (edge_values(), random_values(seed=1)):
        ours = round_to(values, precision)
        theirs = torch.from_numpy(values).to(dtype).float().numpy()
        assert ours.dtype == np.float32 and ours.shape == values.shape
        assert same_bits(ours, theirs)  # observed: equal on all 600k random and 114 edge values
    # The edge values' payloads: torch writes its canonical NaN, this emulation the quieted payload; both are NaN.


@pytest.mark.parametrize("precision, value, expected", [
    ("bf16", 1 + 2 ** -8, 1.0), ("bf16", 1 + 3 * 2 ** -8, 1 + 2 ** -6), ("bf16", 1 + 2 ** -8 + 2 ** -23, 1 + 2 ** -7),
    ("bf16", f32(0x7F7F7FFF), f32(0x7F7F0000)), ("bf16", f32(0x7F7F8000), np.inf), ("bf16", 2 ** -134, 0.0),
    ("bf16", 3 * 2 ** -134, 2 ** -132), ("bf16", 1e5, 99840.0), ("bf16", -65520.0, -65536.0),
    ("f16", 1 + 2 ** -11, 1.0), ("f16", 1 + 3 * 2 ** -11, 1 + 2 ** -9), ("f16", 65519.0, 65504.0),
    ("f16", 65520.0, np.inf), ("f16", -1e5, -np.inf), ("f16", 2 ** -25, 0.0), ("f16", 3 * 2 ** -25, 2 ** -23),
    ("f16", float(np.nextafter(np.float32(2 ** -25), np.float32(1))), 2 ** -24), ("f16", 1e-8, 0.0),
    ("f16", 2 ** -14 - 2 ** -25, 2 ** -14), ("f16", 0.1, 0.0999755859375),
])
def test_round_to_values_written_out(precision, value, expected):
    # Without torch: the boundaries of each format, each value checked by hand.
    got = round_to(np.float32(value), precision)
    assert got.dtype == np.float32 and got.shape == ()
    assert float(got) == expected


def test_round_to_keeps_signs_of_zero_and_infinity_and_nan():
    for precision in ("bf16", "f16"):
        got = round_to([-0.0, -2 ** -140, np.inf, -np.inf, np.nan, -np.nan], precision)
        assert list(np.signbit(got)) == [True, True, False, True, False, True]
        assert list(got[:4]) == [0.0, 0.0, np.inf, -np.inf] and np.isnan(got[4:]).all()


def test_round_to_converts_to_float32_first():
    # The contract rounds x to float32 first: 1 + 2^-8 + 2^-30 is above bf16's tie, but its float32 is the tie
    # itself (2^-30 is below float32's ulp at 1), which goes to the even 1.0; a direct rounding would give 1 + 2^-7.
    assert float(round_to(1 + 2 ** -8 + 2 ** -30, "bf16")) == 1.0
    assert float(round_to(1 + 2 ** -11 + 2 ** -30, "f16")) == 1.0
    assert float(round_to(1 + 2 ** -30, "f32")) == 1.0
    x = np.random.default_rng(2).standard_normal((3, 5))
    assert round_to(x, "f32").dtype == np.float32 and np.array_equal(round_to(x, "f32"), x.astype(np.float32))
    with pytest.raises(ValueError, match="precision must be one of"):
        round_to(x, "fp8")


# ---- the exact sums ------------------------------------------------------------------------------------------------

def exact_sum(terms):
    acc = _ExactSum(())
    for t in terms:
        acc.add(np.float64(t))
    return float(acc.rounded())


def test_sums_are_rounded_once_to_float32():
    # 1 + 2^-24 + 2^-60 is just above the midpoint of 1 and 1 + 2^-23: one rounding gives 1 + 2^-23, while a float64
    # sum (1 + 2^-24, the 2^-60 lost) cast to float32 is the tie, which goes to the even 1.0.
    assert exact_sum([1.0, 2 ** -24, 2 ** -60]) == 1 + 2 ** -23
    assert np.float32(1.0 + 2 ** -24 + 2 ** -60) == 1.0
    # Just below the midpoint of 1 + 2^-23 (odd) and 1 + 2^-22: down to 1 + 2^-23, where the tie would go up.
    assert exact_sum([1 + 2 ** -23, 2 ** -24, -2 ** -60]) == 1 + 2 ** -23
    assert exact_sum([2 ** -60, 1 + 2 ** -23, 2 ** -24]) == 1 + 2 ** -22  # a true tie: to even
    assert exact_sum([1e30, 1.0, -1e30]) == 1.0  # cancellation: exact
    assert exact_sum([np.inf, 1.0]) == np.inf and math.isnan(exact_sum([np.inf, -np.inf]))
    assert math.isnan(exact_sum([1.0, np.nan]))
    assert exact_sum([2.0 ** 128 - 2.0 ** 103, -2.0 ** 60]) == np.finfo(np.float32).max  # below the tie with 2^128


def test_float32_results_do_not_depend_on_the_float64_summation_order_or_exp():
    """Why attnprobe can be held to the emulation bit for bit though it sums in float64 in its own order (BLAS
    blocks, SIMD lanes) and calls its own exp: on these inputs every float32 result of a float64 sum in numpy's
    order equals the exactly rounded one, and numpy's exp and libm's, though they differ in the last float64 bit,
    round to the same float32. A difference would need a float64 error across a float32 rounding boundary: a chance
    of ~n·2^-29 per sum (~1e-6 at n = 600)."""
    differing, total = np.zeros(3, int), np.zeros(3, int)
    for seed, (n, p, sharpness) in enumerate([(600, 128, 2.0), (300, 64, 6.0), (512, 16, 8.0)]):
        rng = np.random.default_rng(10 + seed)
        for precision in ("bf16", "f16"):
            q, k, v = (round_to(rng.standard_normal((n, p)) * s, precision).astype(np.float64)
                       for s in (sharpness, 2.0, 1.0))
            visible = visible_keys(n, n, "causal")
            dots = _ExactSum((n, n))
            for d in range(p):
                dots.add(q[:, d, None] * k[None, :, d])
            dot = dots.rounded()
            scores = dot * np.float32(p ** -0.5)
            shifted = scores - np.where(visible, scores, -np.inf).max(axis=1, keepdims=True).astype(np.float32)
            weights = np.where(visible, np.exp(shifted.astype(np.float64)).astype(np.float32), np.float32(0))
            sums = _ExactSum(n)
            for j in range(n):
                sums.add(weights[:, j].astype(np.float64))
            rounded_weights = round_to(weights, precision).astype(np.float64)
            outputs = _ExactSum((n, p))
            for j in range(n):
                outputs.add(rounded_weights[:, j, None] * v[None, j, :])
            pairs = [(dot, q @ k.T), (sums.rounded(), weights.astype(np.float64).sum(axis=1)),
                     (outputs.rounded(), rounded_weights @ v)]
            for i, (once, blas) in enumerate(pairs):
                differing[i] += int(np.count_nonzero(once != blas.astype(np.float32)))
                total[i] += once.size
    # Observed: 0 of 1.42M dot products, 0 of 2,824 row sums, 0 of 208k numerators differ (peaked rows included:
    # at sharpness 8, 92% of the visible weights are below 2^-29, where float64 sums drop bits).
    assert list(differing) == [0, 0, 0], (differing, total)
    x = -np.random.default_rng(3).exponential(5.0, 200_000).astype(np.float32).astype(np.float64)
    ours, libm = np.exp(x), np.array([math.exp(t) for t in x])
    assert np.array_equal(ours.astype(np.float32), libm.astype(np.float32))  # float64 bits differ for ~24% of them


# ---- exact attention ---------------------------------------------------------------------------------------------

def inputs(seed, n_k, p, n_q=None, sharpness=1.5):
    """float32-valued q (n_q × p), k, v (n_k × p): scores of a few units, attention neither uniform nor one-hot."""
    rng = np.random.default_rng(seed)
    q = (sharpness * rng.standard_normal((n_k if n_q is None else n_q, p))).astype(np.float32)
    k = rng.standard_normal((n_k, p)).astype(np.float32)
    v = rng.standard_normal((n_k, p)).astype(np.float32)
    return q, k, v, 1 / math.sqrt(p)


@pytest.mark.parametrize("mask", ["full", "causal", "window:5"])
def test_f32_mode_is_float32_attention(mask):
    worst = 0.0
    for seed, (n, p) in enumerate([(64, 16), (257, 64), (600, 128)]):
        q, k, v, scale = inputs(seed, n, p)
        got = exact_rounded(q, k, v, scale, "f32", mask)
        want = exact_f64(q, k, v, scale, mask)
        assert got.dtype == np.float32 and got.shape == want.shape
        worst = max(worst, float(np.abs(got - want).max()))
    # Observed max |error| ≤ 3.1e-7 (full), 3.6e-7 (causal), 3.4e-7 (window:5), outputs of size ~1-3: float32
    # roundings only (a few ulps of 2^-24 relative).
    assert worst < 1e-6


def test_rounding_floors_of_bf16_and_f16():
    floors = {precision: [] for precision in PRECISIONS}
    for seed, (n, p) in enumerate([(128, 32), (600, 128)]):
        q, k, v, scale = inputs(20 + seed, n, p)
        for precision in PRECISIONS:
            floors[precision].append(round_floor(q, k, v, scale, precision, "causal"))
    # Observed (n = 128, 600): f32 8.4e-8, 1.2e-7; bf16 3.6e-3, 3.9e-3; f16 5.0e-4, 4.7e-4. bf16 keeps 8
    # significant bits (half an ulp 2^-9 = 2.0e-3 relative), fp16 11 (2^-12 = 2.4e-4): each floor is about two
    # half-ulps of its format (inputs and output each rounded), f16's 7-8 times below bf16's (2^3 in theory).
    assert all(f < 1e-6 for f in floors["f32"])
    assert all(1e-3 < f < 1e-2 for f in floors["bf16"])
    assert all(1e-4 < f < 2e-3 for f in floors["f16"])
    assert all(bf16 > 4 * f16 for bf16, f16 in zip(floors["bf16"], floors["f16"]))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_row_that_sees_one_key_is_that_value_rounded(precision):
    # A row whose only visible key is j: P = exp(0) = 1, l = 1, P̃ = 1, U = v_j in ℓ (a one-term sum), O = U / 1.
    q, k, v, scale = inputs(4, 50, 16)
    v = 100 * v  # values far from representable ones
    causal = exact_rounded(q, k, v, scale, precision, "causal")
    assert np.array_equal(causal[0], round_to(v[0], precision))
    window = exact_rounded(q, k, v, scale, precision, "window:1")
    assert np.array_equal(window, round_to(v, precision))
    decode = exact_rounded(q[:3], k, v, scale, precision, "causal", q_positions=[0, 9, 30])
    assert np.array_equal(decode[0], round_to(v[0], precision))


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_outputs_are_representable_and_decode_rows_are_the_last_rows(precision):
    q, k, v, scale = inputs(5, 300, 64)
    full = exact_rounded(q, k, v, scale, precision, "causal")
    assert np.array_equal(round_to(full, precision), full)
    # Each row depends only on its query and the keys it sees: the last 4 rows as decode rows (default positions
    # n_k − 4..n_k − 1), and rows at chosen positions, equal the self-attention rows bit for bit.
    assert np.array_equal(exact_rounded(q[-4:], k, v, scale, precision, "causal"), full[-4:])
    positions = [7, 120, 121, 299]
    assert np.array_equal(exact_rounded(q[positions], k, v, scale, precision, "causal", q_positions=positions),
                          full[positions])
    window = exact_rounded(q, k, v, scale, precision, "window:5")
    assert np.array_equal(exact_rounded(q[positions], k, v, scale, precision, "window:5", q_positions=positions),
                          window[positions])
    assert relative(window, exact_f64(q, k, v, scale, "window:5")) < 1e-2  # observed 3.1e-3 (bf16), 3.8e-4 (f16)


def test_values_beyond_65504_overflow_in_f16_but_not_in_bf16():
    q, k, v, scale = inputs(6, 40, 16, sharpness=0.3)  # mild scores: no P̃ rounds to 0 in f16 (that would be 0·inf)
    v = (7e4 + 1e3 * v).astype(np.float32)
    assert v.min() >= 65520  # observed 6.71e4: every value rounds to inf in f16
    f16 = exact_rounded(q, k, v, scale, "f16", "causal")
    assert np.isposinf(f16).all()  # every row: positive weights times +inf
    bf16 = exact_rounded(q, k, v, scale, "bf16", "causal")
    assert np.isfinite(bf16).all()
    assert relative(bf16, exact_f64(q, k, v, scale, "causal")) < 1e-2  # observed 2.0e-3
    # A visible key whose P̃ rounds to 0 in f16 (below 2^-25) multiplies an infinite value: 0·inf = NaN in IEEE.
    sharp = 40 * q
    assert np.isnan(exact_rounded(sharp, k, v, scale, "f16", "full")).all()  # observed: every row has such a key


def test_geometry_and_arguments_are_checked():
    assert visible_keys(2, 5, "window:2").tolist() == [[False, False, True, True, False],
                                                       [False, False, False, True, True]]
    assert visible_keys(2, 5, "causal", q_positions=[0, 2]).tolist() == [[True, False, False, False, False],
                                                                         [True, True, True, False, False]]
    q, k, v, scale = inputs(7, 10, 8, n_q=3)
    for bad in ([3, 2, 5], [0, 1, 10], [0, 1]):
        with pytest.raises(ValueError, match="strictly increasing"):
            exact_rounded(q, k, v, scale, "bf16", "causal", q_positions=bad)
    with pytest.raises(ValueError, match="full, causal or window:W"):
        exact_rounded(q, k, v, scale, "bf16", "sliding")
    with pytest.raises(ValueError, match="at least n_q"):
        exact_rounded(k, q, q, scale, "bf16")
