#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of docs/randomness.md. Compiles for host and CUDA device alike, so the GPU
// backend draws bit-identical numbers. Checked against the Random123 known-answer vectors.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ATTNPROBE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ATTNPROBE_HOST_DEVICE inline
#endif

namespace attnprobe {

struct PhiloxCounter {
  uint32_t v[4];
};
struct PhiloxKey {
  uint32_t v[2];
};

namespace philox_detail {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

ATTNPROBE_HOST_DEVICE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

ATTNPROBE_HOST_DEVICE PhiloxCounter round(PhiloxCounter c, PhiloxKey k) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kMul0, c.v[0], hi0, lo0);
  mulhilo(kMul1, c.v[2], hi1, lo1);
  return PhiloxCounter{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}
}  // namespace philox_detail

/// The 10-round Philox4x32 bijection: 128-bit counter × 64-bit key → 128 random bits.
ATTNPROBE_HOST_DEVICE PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key.v[0] += philox_detail::kWeyl0;
      key.v[1] += philox_detail::kWeyl1;
    }
    counter = philox_detail::round(counter, key);
  }
  return counter;
}

/// 32 random bits → uniform float in (0, 1]: never 0, so log() and 1/u are always finite.
ATTNPROBE_HOST_DEVICE float uint_to_unit_float(uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

/// 64 random bits → uniform double in (0, 1] with 53 significant bits.
ATTNPROBE_HOST_DEVICE double uint_to_unit_double(uint32_t hi, uint32_t lo) {
  uint64_t bits = (static_cast<uint64_t>(hi) << 32 | lo) >> 11;
  return (static_cast<double>(bits) + 1.0) * (1.0 / 9007199254740992.0);
}

// Box–Muller's transcendental functions, written out in plain arithmetic (no libm) so that
//  - a loop over a block of draws vectorises (scalar glibc log/sin/cos made Gaussian draws 60% of a
//    Linformer call), and
//  - the host, its vectorised block fill and the CUDA device compute the same bits from the same words
//    (up to where each compiler contracts a·b + c into one FMA).
// Accuracy: within ~2 ulp of the correctly rounded value over the inputs Box–Muller gives them (tested
// against libm in tests/test_philox.cpp); the law of the draws is that of exact Box–Muller.
namespace box_muller_detail {
// The float64 and float32 versions below share their range reductions and the quadrant's swaps and signs
// (these templates); their series differ in degree and constants, which is what the precision is.
template <typename Real>
struct Layout;
template <>
struct Layout<double> {
  using Bits = uint64_t;
  using Int = int64_t;
  static constexpr int kMantissaBits = 52;
  static constexpr Int kExponentBias = 1023;
  static constexpr Bits kMantissaMask = 0x000FFFFFFFFFFFFFull, kOneBits = 0x3FF0000000000000ull;
  static constexpr double kSqrt2 = 1.4142135623730951;
};
template <>
struct Layout<float> {
  using Bits = uint32_t;
  using Int = int32_t;
  static constexpr int kMantissaBits = 23;
  static constexpr Int kExponentBias = 127;
  static constexpr Bits kMantissaMask = 0x007FFFFFu, kOneBits = 0x3F800000u;
  static constexpr float kSqrt2 = 1.41421356f;
};

template <typename Real>
ATTNPROBE_HOST_DEVICE typename Layout<Real>::Bits to_bits(Real x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Real) == 8)
    return static_cast<uint64_t>(__double_as_longlong(x));
  else
    return static_cast<uint32_t>(__float_as_uint(x));
#else
  typename Layout<Real>::Bits b;
  __builtin_memcpy(&b, &x, sizeof b);
  return b;
#endif
}
template <typename Real>
ATTNPROBE_HOST_DEVICE Real from_bits(typename Layout<Real>::Bits b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Real) == 8)
    return __longlong_as_double(static_cast<long long>(b));
  else
    return __uint_as_float(b);
#else
  Real x;
  __builtin_memcpy(&x, &b, sizeof x);
  return x;
#endif
}

/// x = m·2^e for a positive normal x, with m ∈ [√½, √2): returns s = (m − 1)/(m + 1) (|s| ≤ 0.172, the atanh
/// series' variable) and sets e. Branch-free.
template <typename Real>
ATTNPROBE_HOST_DEVICE Real log_reduction(Real x, Real& e) {
  using L = Layout<Real>;
  const typename L::Bits bits = to_bits(x);
  e = static_cast<Real>(static_cast<typename L::Int>(bits >> L::kMantissaBits) - L::kExponentBias);
  Real m = from_bits<Real>((bits & L::kMantissaMask) | L::kOneBits);  // [1, 2)
  const bool high = m > L::kSqrt2;
  m = high ? Real(0.5) * m : m;
  e = high ? e + Real(1) : e;
  const Real f = m - Real(1);
  return f / (Real(2) + f);
}

/// The quadrant k mod 4 (k ∈ {0, …, 4}) applied to sin r and cos r: as two 0/1 digits in Real, and the
/// swaps and signs as exact arithmetic on them (1·x + 0·y = x): comparisons and integer lanes beside the
/// floating ones kept the compiler from vectorising the loop.
template <typename Real>
ATTNPROBE_HOST_DEVICE void apply_quadrant(Real k, Real sin_r, Real cos_r, Real& sin_out, Real& cos_out) {
  using Int = typename Layout<Real>::Int;
  const Real quadrant = k - Real(4) * static_cast<Real>(static_cast<Int>(Real(0.25) * k));
  const Real high = static_cast<Real>(static_cast<Int>(Real(0.5) * quadrant));  // quadrant 2 or 3
  const Real odd = quadrant - Real(2) * high;                                   // quadrant 1 or 3
  const Real s = odd * cos_r + (Real(1) - odd) * sin_r, c = odd * sin_r + (Real(1) - odd) * cos_r;
  sin_out = (Real(1) - Real(2) * high) * s;
  cos_out = (Real(1) - Real(2) * (odd + high - Real(2) * odd * high)) * c;
}
}  // namespace box_muller_detail

/// Natural log of a positive normal double x (Box–Muller calls it on u ∈ (0, 1]): x = m·2^e with
/// m ∈ [√½, √2), log m = 2·atanh(s) = 2(s + s³/3 + s⁵/5 + …), s = (m − 1)/(m + 1), |s| ≤ 0.172, so the
/// series to s²³ is below 1e-18 relative; e·ln 2 is added in two parts (ln 2 = hi + lo, hi with
/// trailing zeros so e·hi is exact). Branch-free.
ATTNPROBE_HOST_DEVICE double unit_log(double x) {
  double e;
  const double s = box_muller_detail::log_reduction(x, e);
  const double s2 = s * s;
  double poly = 1.0 / 23;
  poly = poly * s2 + 1.0 / 21;
  poly = poly * s2 + 1.0 / 19;
  poly = poly * s2 + 1.0 / 17;
  poly = poly * s2 + 1.0 / 15;
  poly = poly * s2 + 1.0 / 13;
  poly = poly * s2 + 1.0 / 11;
  poly = poly * s2 + 1.0 / 9;
  poly = poly * s2 + 1.0 / 7;
  poly = poly * s2 + 1.0 / 5;
  poly = poly * s2 + 1.0 / 3;
  const double log_m = 2.0 * s + 2.0 * s * s2 * poly;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 rounded to 32 significant bits
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 − kLn2Hi
  return e * kLn2Hi + (log_m + e * kLn2Lo);
}

/// sin(2πu) and cos(2πu) for u ∈ [0, 1]: the nearest quarter k/4 is removed exactly (u − k/4 is
/// representable), leaving r = 2π(u − k/4) ∈ [−π/4, π/4] for Taylor series to r¹⁷ / r¹⁶ (remainders
/// below 1e-17 relative), then the quadrant k mod 4 swaps and negates.
ATTNPROBE_HOST_DEVICE void sincos_two_pi(double u, double& sin_out, double& cos_out) {
  // Nearest quarter: truncation is floor for this non-negative argument (floor() did not vectorise).
  const double k = static_cast<double>(static_cast<int64_t>(4.0 * u + 0.5));
  const double r = (u - 0.25 * k) * 6.283185307179586476925;
  const double r2 = r * r;
  double sp = 1.0 / 355687428096000.0;  // sin r = r + r³·(−1/3! + r²/5! − … + r¹⁴/17!), Horner in r²
  sp = sp * r2 - 1.0 / 1307674368000.0;
  sp = sp * r2 + 1.0 / 6227020800.0;
  sp = sp * r2 - 1.0 / 39916800.0;
  sp = sp * r2 + 1.0 / 362880.0;
  sp = sp * r2 - 1.0 / 5040.0;
  sp = sp * r2 + 1.0 / 120.0;
  sp = sp * r2 - 1.0 / 6.0;
  const double sin_r = r + r * r2 * sp;
  double cp = 1.0 / 20922789888000.0;  // cos r = 1 − r²/2! + r⁴/4! − … + r¹⁶/16!
  cp = cp * r2 - 1.0 / 87178291200.0;
  cp = cp * r2 + 1.0 / 479001600.0;
  cp = cp * r2 - 1.0 / 3628800.0;
  cp = cp * r2 + 1.0 / 40320.0;
  cp = cp * r2 - 1.0 / 720.0;
  cp = cp * r2 + 1.0 / 24.0;
  cp = cp * r2 - 0.5;
  const double cos_r = 1.0 + r2 * cp;
  box_muller_detail::apply_quadrant(k, sin_r, cos_r, sin_out, cos_out);
}

/// Box–Muller on two uniforms in (0, 1]: r = √(−2 ln u1), φ = 2π·u2; first = r·cos φ, second = r·sin φ.
ATTNPROBE_HOST_DEVICE void box_muller(double u1, double u2, double& first, double& second) {
  const double radius = sqrt(-2.0 * unit_log(u1));
  double s, c;
  sincos_two_pi(u2, s, c);
  first = radius * c;
  second = radius * s;
}

// The same three functions in float32, for draws that are used as floats (Linformer's projections): 16
// lanes per AVX-512 register instead of 8, lower-degree series, and four normals per Philox block instead
// of two; the range reductions and the quadrant step are the float64 ones' (box_muller_detail). Within ~3
// float ulp of the exact value (tested against libm in float64).

/// unit_log in float32 for a positive normal float x: the same reduction, the atanh series to s⁹ (|s| ≤
/// 0.172: the remainder is below 2e-9 relative), ln 2 in two parts (hi with 9 trailing zero bits, so
/// e·hi is exact for |e| < 2⁹).
ATTNPROBE_HOST_DEVICE float unit_log_f(float x) {
  float e;
  const float s = box_muller_detail::log_reduction(x, e);
  const float s2 = s * s;
  float poly = 1.0f / 9;
  poly = poly * s2 + 1.0f / 7;
  poly = poly * s2 + 1.0f / 5;
  poly = poly * s2 + 1.0f / 3;
  const float log_m = 2.0f * s + 2.0f * s * s2 * poly;
  constexpr float kLn2Hi = 0.693145751953125f;      // ln 2 rounded to 15 significant bits
  constexpr float kLn2Lo = 1.4286068202862268e-6f;  // ln 2 − kLn2Hi
  return e * kLn2Hi + (log_m + e * kLn2Lo);
}

/// sincos_two_pi in float32 for u ∈ [0, 1] a multiple of 2⁻²⁴ (a uniform float): u − k/4 is exact, and
/// the Taylor series run to r⁹ / r¹⁰ on r ∈ [−π/4, π/4] (remainders below 2e-9).
ATTNPROBE_HOST_DEVICE void sincos_two_pi_f(float u, float& sin_out, float& cos_out) {
  const float k = static_cast<float>(static_cast<int32_t>(4.0f * u + 0.5f));
  const float r = (u - 0.25f * k) * 6.28318530717958647692f;
  const float r2 = r * r;
  float sp = 1.0f / 362880.0f;  // sin r = r + r³·(−1/3! + r²/5! − r⁴/7! + r⁶/9!)
  sp = sp * r2 - 1.0f / 5040.0f;
  sp = sp * r2 + 1.0f / 120.0f;
  sp = sp * r2 - 1.0f / 6.0f;
  const float sin_r = r + r * r2 * sp;
  float cp = -1.0f / 3628800.0f;  // cos r = 1 − r²/2! + r⁴/4! − … − r¹⁰/10!
  cp = cp * r2 + 1.0f / 40320.0f;
  cp = cp * r2 - 1.0f / 720.0f;
  cp = cp * r2 + 1.0f / 24.0f;
  cp = cp * r2 - 0.5f;
  const float cos_r = 1.0f + r2 * cp;
  box_muller_detail::apply_quadrant(k, sin_r, cos_r, sin_out, cos_out);
}

/// Box–Muller in float32 on two uniform floats in (0, 1]. u1 ≥ 2⁻²⁴ bounds the radius at √(48 ln 2) ≈ 5.77:
/// the law is the normal one cut at 5.77σ, a tail of probability 8e-9.
ATTNPROBE_HOST_DEVICE void box_muller_f(float u1, float u2, float& first, float& second) {
  const float radius = sqrtf(-2.0f * unit_log_f(u1));
  float s, c;
  sincos_two_pi_f(u2, s, c);
  first = radius * c;
  second = radius * s;
}

}  // namespace attnprobe
