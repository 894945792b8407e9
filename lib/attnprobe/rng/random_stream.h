#pragma once
// Keyed random streams (docs/randomness.md). A draw is a pure function of
//   (seed, hash of the canonical case id, trial)  -> the 64-bit Philox key, and
//   (purpose, logical indices a, b, c)            -> the 128-bit Philox counter,
// never of thread id or loop order. An estimator names each draw by what it is (row a of
// projection f, sample s of query i, ...), so any schedule, a filtered rerun and the GPU all
// see the same numbers. Free of Eigen, so the CUDA kernels include it as it is (matrices of draws:
// random_matrix.h).
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "attnprobe/rng/philox.h"

namespace attnprobe {

struct RandomKey {
  uint64_t value = 0;
};

/// Mixes seed, case hash and trial into one Philox key (splitmix64 rounds: every input bit
/// affects every key bit, so neighbouring trials get unrelated streams).
RandomKey make_random_key(uint64_t seed, uint64_t case_hash, uint32_t trial);
RandomKey make_random_key(uint64_t seed, std::string_view case_id, uint32_t trial);

/// Purpose tags keep the draws of one estimator apart (two purposes never share a counter).
enum class Purpose : uint32_t {
  kGeneric = 0,
  kHashProjection = 1,
  kSignFlip = 2,
  kRowSample = 3,
  kColumnSample = 4,
  kFeature = 5,
  kFeatureNorm = 6,
  kNoise = 7,
  kComponent = 8,
  kProjection = 9,
  kPilotSample = 10,       ///< vattention's pilot draws (row position t, draw s)
  kUpstreamGradient = 32,  ///< the gradient metrics' G (sweep/runner.h); apart from estimator purposes
};

class RandomStream {
 public:
  ATTNPROBE_HOST_DEVICE RandomStream(RandomKey key, Purpose purpose)
      : key_{{static_cast<uint32_t>(key.value), static_cast<uint32_t>(key.value >> 32)}},
        purpose_(static_cast<uint32_t>(purpose)) {}

  /// The 4 raw words at logical position (a, b, c).
  ATTNPROBE_HOST_DEVICE PhiloxCounter bits(uint32_t a, uint32_t b = 0, uint32_t c = 0) const {
    return philox4x32_10(PhiloxCounter{{a, b, c, purpose_}}, key_);
  }

  /// Uniform in (0, 1] at position (a, b, c).
  ATTNPROBE_HOST_DEVICE double uniform(uint32_t a, uint32_t b = 0, uint32_t c = 0) const {
    PhiloxCounter r = bits(a, b, c);
    return uint_to_unit_double(r.v[0], r.v[1]);
  }

  /// Uniform integer in [0, n) at position (a, b, c).
  ATTNPROBE_HOST_DEVICE uint32_t index(uint32_t n, uint32_t a, uint32_t b = 0, uint32_t c = 0) const {
    uint32_t i = static_cast<uint32_t>(uniform(a, b, c) * n);  // u in (0,1]: clamp u*n == n
    return i >= n ? n - 1 : i;
  }

  /// Element t of the standard-normal sequence of row (a, c): Box–Muller (philox.h's box_muller) on the
  /// Philox block at counter (a, t/2, c), which yields the pair (t even: r·cos φ, t odd: r·sin φ).
  ATTNPROBE_HOST_DEVICE double normal(uint32_t a, uint32_t t, uint32_t c = 0) const {
    PhiloxCounter r = bits(a, t >> 1, c);
    double first, second;
    box_muller(uint_to_unit_double(r.v[0], r.v[1]), uint_to_unit_double(r.v[2], r.v[3]), first, second);
    return (t & 1u) ? second : first;
  }

  /// Element t of the float32 normal sequence of row (a, c), for draws used as floats (Linformer's
  /// projections): box_muller_f (philox.h) on the Philox block at counter (a, t/4, c), whose words 0 and 1
  /// give elements 4b and 4b + 1 (r·cos φ, r·sin φ) and words 2 and 3 elements 4b + 2 and 4b + 3, each
  /// word a uniform float. A sequence of its own, not normal() rounded: twice the draws per block, and
  /// float arithmetic throughout (~2.6× faster to fill).
  ATTNPROBE_HOST_DEVICE float float_normal(uint32_t a, uint32_t t, uint32_t c = 0) const {
    const PhiloxCounter r = bits(a, t >> 2, c);
    const int pair = (t >> 1) & 1u;
    float first, second;
    box_muller_f(uint_to_unit_float(r.v[2 * pair]), uint_to_unit_float(r.v[2 * pair + 1]), first, second);
    return (t & 1u) ? second : first;
  }

  /// A random sign at position (row, index): ±1, 128 signs per Philox block (block index/128 of the
  /// row, bit index mod 128).
  ATTNPROBE_HOST_DEVICE int sign(uint32_t row, uint32_t index) const {
    const PhiloxCounter r = bits(row, index >> 7);
    return (r.v[(index >> 5) & 3] >> (index & 31)) & 1u ? 1 : -1;
  }

  /// The fill API. out[0..count) = elements t0..t0+count-1 of the normal sequence of row (a, c): the same
  /// numbers as normal(a, t0 + j, c), bit for bit, drawn a block of Philox counters at a time with the
  /// vectorised Box–Muller (rng/random_stream.cpp). Any t0, even or odd (t0 + count ≤ 2^32): a tile of a
  /// row, so a long row need never be held whole. (Draws wanted as floats: float_normals below.)
  void normals(uint32_t a, uint32_t c, double* out, int64_t count, uint32_t t0 = 0) const;

  /// out[0..count) = elements t0..t0+count-1 of the float normal sequence of row (a, c): float_normal(a,
  /// t0 + j, c), bit for bit, a block of Philox counters at a time. Any t0 (t0 + count ≤ 2^32).
  void float_normals(uint32_t a, uint32_t c, float* out, int64_t count, uint32_t t0 = 0) const;

  /// out[j] = uniform(a, b0 + j, c) for j in [0, count): the same numbers, a block at a time.
  void uniforms(uint32_t a, uint32_t b0, uint32_t c, double* out, int64_t count) const;

 private:
  PhiloxKey key_;
  uint32_t purpose_;
};

/// Draws `count` indices from [0, n) with probabilities ∝ weights, with replacement, by inverse
/// CDF on the uniform at position (row, s) for draw s. Zero weights are never drawn; all-zero or
/// non-finite weights throw std::invalid_argument.
std::vector<int64_t> sample_with_replacement(const std::vector<double>& weights, int64_t count,
                                             const RandomStream& stream, uint32_t row = 0);

/// Draws min(count, #positive weights) distinct indices with probabilities ∝ weights, by
/// successive sampling (each draw ∝ the remaining weights), implemented with Efraimidis–Spirakis
/// keys log(u_j)/w_j and a top-k: u_j is the uniform at position (row, j), so the draw depends
/// on each item's own number only. Returned in draw order (largest key first).
std::vector<int64_t> sample_without_replacement(const std::vector<double>& weights, int64_t count,
                                                const RandomStream& stream, uint32_t row = 0);

/// Uniform sampling without replacement of `count` of n items (all weights equal).
std::vector<int64_t> sample_uniform_without_replacement(int64_t n, int64_t count, const RandomStream& stream,
                                                        uint32_t row = 0);

}  // namespace attnprobe
