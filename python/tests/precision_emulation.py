"""An independent numpy emulation of attnprobe's exact attention in bf16 and fp16 (docs/precision.md), for the tests.

Written from the rules of the precision modes, not from the C++: every rounding point the rules name is done here
explicitly, and nothing else rounds, so that attnprobe.exact(..., precision=ℓ) can be compared with it bit for bit.
numpy only (no torch, no ml_dtypes): the rounding to bf16/fp16 is integer arithmetic on the float32 bit pattern.

Rounding points of ``exact_rounded`` (FlashAttention-2's forward; each float32 accumulation done wider and rounded
once to float32, so the listed roundings are the only error):

1. q, k, v → float32 → ℓ (``round_to``).
2. dot_ij = fl32(Σ_d q_id·k_jd), the sum exact (see ``_ExactSum``) and rounded once;
   S_ij = fl32(dot_ij · fl32(scale)), a float32 product.
3. m_i = max of S_ij over the keys row i sees; P_ij = fl32(exp(float64(fl32(S_ij − m_i)))), the difference a float32
   subtraction, the exponential in float64, rounded to float32; l_i = fl32(Σ_j P_ij), exact sum rounded once.
4. P̃_ij = round_ℓ(P_ij); U_ic = fl32(Σ_j P̃_ij·v_jc), exact sum rounded once (v already in ℓ).
5. O_ic = round_ℓ(fl32(U_ic / l_i)), a float32 division, then rounded to ℓ.

Keys a row does not see take no part in any of the sums or the max. Geometry: q has n_q rows, k and v n_k ≥ n_q;
query row i sits at key position t_i (default n_k − n_q + i); mask "full" (every key), "causal" (keys 0..t_i),
"window:W" (keys t_i−W+1..t_i, clipped at 0).
"""
import math

import numpy as np

PRECISIONS = ("f32", "bf16", "f16")

# Per format: explicit significand bits (after the leading 1), smallest normal exponent, largest finite value.
_FORMATS = {
    "bf16": (7, -126, float(np.uint32(0x7F7F0000).view(np.float32))),  # 3.3895314e38
    "f16": (10, -14, 65504.0),
}


def round_to(x, precision):
    """``x`` converted to float32 (numpy's cast: round to nearest even), then rounded to ``precision``
    ("f32", "bf16" or "f16"), as a float32 array of the same shape.

    Round to nearest, ties to even, on the float32 value's 24-bit significand M (with its leading 1; M·2^(e−150) for a
    normal float32, M·2^−149 for a subnormal one): the result's quantum is 2^(max(E, E_min) − t) with E the value's
    binary exponent, t the format's significand bits (bf16 7, fp16 10) and E_min its smallest normal exponent
    (bf16 −126, fp16 −14), so values below 2^E_min become the format's subnormals (fp16: multiples of 2^−24) and
    those below half the smallest subnormal become ±0 (a tie, exactly half of it, too: 0 is even). A result above the
    largest finite value (bf16 3.3895314e38, fp16 65504; fp16 from 65520 up, the tie going to the even 2^16)
    is ±inf. ±inf stays; NaN stays NaN (quiet, sign and the leading payload bits kept, as a hardware conversion
    there and back keeps them). The sign of zero is kept.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    with np.errstate(over="ignore"):  # a double beyond float32's range is ±inf, as the cast says
        x32 = np.array(x, dtype=np.float32)  # a copy: the float32 conversion the contract starts with
    if precision == "f32":
        return x32
    mantissa_bits, min_exponent, largest = _FORMATS[precision]
    bits = x32.view(np.uint32).astype(np.uint64)
    biased = (bits >> np.uint64(23)) & np.uint64(0xFF)
    fraction = bits & np.uint64(0x7FFFFF)
    normal = biased > 0
    significand = np.where(normal, fraction | np.uint64(1 << 23), fraction)  # M, the value being M·2^lowest
    lowest = np.where(normal, biased.astype(np.int64) - 150, -149)  # the exponent of M's last bit
    exponent = np.where(normal, biased.astype(np.int64) - 127, -126)  # E; a float32 subnormal is below E_min anyway
    quantum = np.maximum(exponent, min_exponent) - mantissa_bits  # the exponent of the result's last bit
    # Bits of M dropped: ≥ 16 for bf16, ≥ 13 for fp16; capped at 26, where M < 2^24 is below a quarter quantum
    # and rounds to 0 all the same (and the shifts stay in range).
    drop = np.minimum(quantum - lowest, 26).astype(np.uint64)
    kept = significand >> drop
    remainder = significand & ((np.uint64(1) << drop) - np.uint64(1))
    half = np.uint64(1) << (drop - np.uint64(1))
    round_up = (remainder > half) | ((remainder == half) & ((kept & np.uint64(1)) == np.uint64(1)))
    kept = kept + round_up.astype(np.uint64)  # a carry to 2^(t+1) is the next binade: still exact below
    magnitude = np.ldexp(kept.astype(np.float64), quantum.astype(np.int64))  # exact: ≤ 12 significant bits
    magnitude = np.where(magnitude > largest, np.inf, magnitude)
    negative = (bits >> np.uint64(31)) == np.uint64(1)
    rounded = np.where(negative, -magnitude, magnitude).astype(np.float32)  # representable: the cast is exact
    # Infinities and NaN: biased exponent 255. inf keeps its bits; NaN is quieted with its payload cut to the format.
    keep_bits = np.uint32(0xFFFF0000 if precision == "bf16" else 0xFFFFE000)
    special = x32.view(np.uint32)
    nan_bits = (special & keep_bits) | np.uint32(0x00400000)
    special = np.where(np.isnan(x32), nan_bits, special).view(np.float32)
    return np.where(biased == 255, special, rounded).astype(np.float32)


class _ExactSum:
    """Σ of float64 terms that are exact products (of two float32 values: 48 significant bits at most), kept as an
    unevaluated double-double (Knuth's TwoSum, error terms summed in float64) and rounded once to float32.

    Why not np.sum: float64 sums of these terms are exact for products of bf16 values of ordinary range, but not for
    sums of P_ij whose tiny terms (below 2^−29 of the sum) lose bits, and a float64 rounding error can, rarely, sit
    across a float32 rounding boundary: then the result would depend on the summation order. The double-double carries
    the sum to ~2^−100 of Σ|terms|, so the final rounding is the one of the exact sum except in cancellation below
    that (never in these tests). Infinities and NaN follow IEEE addition (inf + −inf = NaN), any order.
    """

    def __init__(self, shape):
        self.hi = np.zeros(shape)
        self.lo = np.zeros(shape)
        self.plain = np.zeros(shape)  # the plain float64 sum: carries inf and NaN

    def add(self, term):
        with np.errstate(invalid="ignore"):
            total = self.hi + term
            back = total - self.hi
            self.lo += (self.hi - (total - back)) + (term - back)
            self.hi = total
            self.plain += term

    def rounded(self):
        """fl32(hi + lo): the float32 nearest to the double-double, ties to even."""
        with np.errstate(invalid="ignore", over="ignore"):
            hi = self.hi + self.lo
            lo = self.lo - (hi - self.hi)  # (hi, lo) renormalised: |lo| ≤ half an ulp of hi
            r = hi.astype(np.float32)
            # Casting hi alone is right unless hi is exactly halfway between two float32 values and lo ≠ 0: then the
            # exact sum lies on lo's side of the midpoint.
            toward = np.where(hi > r.astype(np.float64), np.float32(np.inf), np.float32(-np.inf))
            neighbour = np.nextafter(r, toward)
            midpoint = np.isfinite(r) & (r.astype(np.float64) != hi) & (
                r.astype(np.float64) + neighbour.astype(np.float64) == 2 * hi)
            upper, lower = np.maximum(r, neighbour), np.minimum(r, neighbour)
            r = np.where(midpoint & (lo > 0), upper, np.where(midpoint & (lo < 0), lower, r))
            # The one midpoint cast to inf: halfway between the largest float32 and 2^128, with lo pulling inward.
            edge = float(2.0 ** 128 - 2.0 ** 103)
            r = np.where((hi == edge) & (lo < 0), np.float32(np.finfo(np.float32).max), r)
            r = np.where((hi == -edge) & (lo > 0), np.float32(-np.finfo(np.float32).max), r)
            return np.where(np.isfinite(self.plain), r, self.plain.astype(np.float32)).astype(np.float32)


def query_positions(n_q, n_k, q_positions=None):
    """t_i: ``q_positions`` (strictly increasing, in 0..n_k−1), by default n_k − n_q + i (bottom-right)."""
    if q_positions is None:
        return np.arange(n_k - n_q, n_k)
    t = np.asarray(q_positions, dtype=np.int64).reshape(-1)
    if t.shape != (n_q,) or np.any(np.diff(t) <= 0) or t.min() < 0 or t.max() >= n_k:
        raise ValueError(f"q_positions must be {n_q} strictly increasing positions in 0..{n_k - 1}")
    return t


def visible_keys(n_q, n_k, mask="full", q_positions=None):
    """n_q × n_k booleans: key j takes part in row i ("full": all; "causal": j ≤ t_i; "window:W": t_i−W < j ≤ t_i)."""
    if n_k < n_q:
        raise ValueError(f"k and v need at least n_q = {n_q} rows, got {n_k}")
    t = query_positions(n_q, n_k, q_positions)[:, None]
    j = np.arange(n_k)[None, :]
    if mask == "full":
        return np.ones((n_q, n_k), dtype=bool)
    if mask == "causal":
        return j <= t
    if isinstance(mask, str) and mask.startswith("window:"):
        w = int(mask[len("window:"):])
        if w < 1:
            raise ValueError(f"window:W needs W ≥ 1, got {mask}")
        return (j <= t) & (j > t - w)
    raise ValueError(f"mask must be full, causal or window:W, got {mask!r}")


def _matrices(q, k, v):
    q, k, v = (np.asarray(x) for x in (q, k, v))
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(f"q (n_q × p), k (n_k × p), v (n_k × pv) expected, got {q.shape}, {k.shape}, {v.shape}")
    return q, k, v


def exact_rounded(q, k, v, scale, precision, mask="full", q_positions=None):
    """Exact attention at precision ``precision`` ("f32", "bf16", "f16"): a float32 n_q × pv array whose values are
    representable in it, computed at the rounding points of the module's docstring (steps 1–5) and nowhere else.

    The sums are exact and rounded once to float32 (``_ExactSum``); the products that enter them (q_id·k_jd and
    P̃_ij·v_jc, both of float32 values) are exact in float64. Nothing else rounds: the float32 product, difference
    and quotient of steps 2, 3 and 5 are IEEE operations, each rounded once; the one inexact step not named by the
    rules is the float64 exp itself (numpy's, within an ulp of float64), whose error can change P_ij only when
    exp(x) lies within ~2^−53 of a float32 rounding boundary.
    """
    q, k, v = _matrices(q, k, v)
    n_q, n_k = q.shape[0], k.shape[0]
    visible = visible_keys(n_q, n_k, mask, q_positions)
    # 1. q, k, v in ℓ (float32 first).
    q_l, k_l, v_l = (round_to(x, precision).astype(np.float64) for x in (q, k, v))
    # 2. Scores: the dot product summed exactly, rounded once; the scale applied as a float32 product.
    dot = _ExactSum((n_q, n_k))
    for d in range(q_l.shape[1]):
        with np.errstate(invalid="ignore"):  # inf·0 = NaN, as IEEE says
            dot.add(q_l[:, d, None] * k_l[None, :, d])
    with np.errstate(over="ignore", invalid="ignore"):
        scores = dot.rounded() * np.float32(scale)  # float32 × float32: one rounding
    # 3. Row max over the visible keys (NaN propagates, as np.max does), P in float32 from a float64 exp.
    row_max = np.max(np.where(visible, scores, np.float32(-np.inf)), axis=1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = scores - row_max  # float32 − float32: one rounding
        p = np.exp(shifted.astype(np.float64)).astype(np.float32)
    row_sum = _ExactSum(n_q)
    for j in range(n_k):
        row_sum.add(np.where(visible[:, j], p[:, j].astype(np.float64), 0.0))
    l_row = row_sum.rounded()
    # 4. P rounded to ℓ, then P̃·V summed exactly over the visible keys, rounded once.
    p_l = round_to(p, precision).astype(np.float64)
    numerator = _ExactSum((n_q, v_l.shape[1]))
    for j in range(n_k):
        with np.errstate(invalid="ignore"):  # 0·inf = NaN for a visible key, as IEEE says
            term = p_l[:, j, None] * v_l[None, j, :]
        numerator.add(np.where(visible[:, j, None], term, 0.0))
    u = numerator.rounded()
    # 5. The normalisation as a float32 quotient, rounded to ℓ.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        out = u / l_row[:, None]  # float32 / float32: one rounding
    return round_to(out, precision)


def exact_f64(q, k, v, scale, mask="full", q_positions=None):
    """R*: exact attention in float64 of the unrounded inputs (max-subtracted softmax over the visible keys)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in _matrices(q, k, v))
    visible = visible_keys(q.shape[0], k.shape[0], mask, q_positions)
    scores = np.where(visible, float(scale) * (q @ k.T), -np.inf)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)) @ v


def round_floor(q, k, v, scale, precision, mask="full", q_positions=None):
    """The metric round_floor = ‖R_ℓ − R*‖_F / ‖R*‖_F: R_ℓ = exact_rounded, R* = exact_f64 (float64 norms)."""
    reference = exact_f64(q, k, v, scale, mask, q_positions)
    rounded = exact_rounded(q, k, v, scale, precision, mask, q_positions).astype(np.float64)
    return float(np.linalg.norm(rounded - reference) / np.linalg.norm(reference))


# ---- values for the tests ------------------------------------------------------------------------------------

def f32(bits):
    """The float32 with these bits."""
    return float(np.uint32(bits).view(np.float32))


def edge_values():
    """float32 values at every boundary of the two formats' rounding, with their negatives."""
    values = [
        0.0, 1.0, 2.0, 3.0, 0.1, 1 / 3, math.pi, 1e4, 1e-4,
        # bf16 ties (8-bit significand): 1 + 2^-8 goes down to the even 1, 1 + 3·2^-8 up to the even 1 + 2^-6;
        # one float32 ulp past the tie rounds up.
        1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -23, 1 + 2 ** -8 - 2 ** -23,
        # fp16 ties (11-bit significand).
        1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -11 + 2 ** -23, 1 + 2 ** -11 - 2 ** -23, 2049.0, 2051.0,
        # fp16's largest finite 65504, the tie above it (65520 → inf: 65504's significand is odd), just below it.
        65504.0, 65505.0, 65519.0, np.nextafter(np.float32(65520), np.float32(0)), 65520.0, 65536.0, 1e5, 1e30,
        # bf16's largest finite (0x7F7F0000), its tie with 2^128 (→ inf) and below; float32's largest (→ inf in both).
        f32(0x7F7F0000), f32(0x7F7F7FFF), f32(0x7F7F8000), f32(0x7F7FFFFF),
        # fp16 subnormals (multiples of 2^-24): 2^-25 is a tie to 0, one ulp above it 2^-24, 3·2^-25 a tie to 2^-23.
        2 ** -14, 2 ** -14 - 2 ** -24, 2 ** -15 + 2 ** -25, 2 ** -24, 2 ** -25, np.nextafter(np.float32(2 ** -25),
                                                                                              np.float32(1)),
        3 * 2 ** -25, 5 * 2 ** -25, 2 ** -26, 1e-8, 6e-8, 2 ** -14 - 2 ** -25,
        # bf16 subnormals (multiples of 2^-133) and float32 subnormals: 2^-134 a tie to 0, 3·2^-134 to 2^-132.
        2 ** -126, 2 ** -126 - 2 ** -133, 2 ** -133, 2 ** -134, 3 * 2 ** -134, 2 ** -134 + 2 ** -149, 2 ** -149,
        f32(0x007FFFFF), f32(0x00008000), f32(0x00018000),
        np.inf, np.nan, f32(0x7F800001), f32(0x7FC00001),  # inf, quiet NaN, a signalling NaN, a NaN with low payload
    ]
    values = np.array(values, dtype=np.float32)
    return np.concatenate([values, -values])


def random_values(seed, count=200_000):
    """float32 values over the whole range: normal draws at magnitudes 2^-150..2^130 and random bit patterns."""
    rng = np.random.default_rng(seed)
    scaled = rng.standard_normal(count) * np.exp2(rng.uniform(-150, 130, count))
    with np.errstate(over="ignore"):
        scaled = scaled.astype(np.float32)
    patterns = rng.integers(0, 2 ** 32, count, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([scaled, patterns, rng.standard_normal(count).astype(np.float32)])


def same_bits(a, b):
    """Equal float32 bit patterns, NaN with any payload counting as equal (the rules say only that NaN stays NaN)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    numbers = ~np.isnan(a)
    return np.array_equal(a.view(np.uint32)[numbers], b.view(np.uint32)[numbers])
