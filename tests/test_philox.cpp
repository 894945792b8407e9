// The keyed generator: Philox4x32-10 known answers, the uniform/normal maps, keying, and the
// shared sampling helpers (with and without replacement) against their exact laws.
#include <bit>
#include <cmath>
#include <map>
#include <numeric>

#include "attnprobe/rng/random_stream.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[rng]") {
  struct Kat {
    PhiloxCounter counter;
    PhiloxKey key;
    PhiloxCounter expected;
  };
  // Random123 kat_vectors, "philox4x32 10" lines: counter, key, expected output.
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& kat : kats) {
    const PhiloxCounter out = philox4x32_10(kat.counter, kat.key);
    for (int i = 0; i < 4; ++i) CHECK(out.v[i] == kat.expected.v[i]);
  }
}

TEST_CASE("uniforms lie in the half-open unit interval and normals have mean 0 and variance 1", "[rng]") {
  const RandomStream stream(make_random_key(7, "moments", 0), Purpose::kGeneric);
  const int count = 200000;
  double sum = 0, sum2 = 0, usum = 0;
  for (int i = 0; i < count; ++i) {
    const double u = stream.uniform(i);
    REQUIRE(u > 0.0);
    REQUIRE(u <= 1.0);
    usum += u;
    const double z = stream.normal(i / 2, i % 2);
    sum += z;
    sum2 += z * z;
  }
  // Standard errors: uniform mean 1/sqrt(12·count) = 6.5e-4; normal mean 1/sqrt(count) = 2.2e-3;
  // normal variance sqrt(2/count) = 3.2e-3. Bounds are 4 standard errors. Observed (seed 7):
  // |Δu| = 4.0e-4, |mean| = 1.5e-3, |var − 1| = 2.5e-3.
  CHECK(std::abs(usum / count - 0.5) < 4 * 6.5e-4);
  CHECK(std::abs(sum / count) < 4 * 2.3e-3);
  CHECK(std::abs(sum2 / count - 1.0) < 4 * 3.2e-3);
}

TEST_CASE("normals() fills the same numbers as normal() two per Philox block", "[rng]") {
  const RandomStream stream(make_random_key(1, "fill", 3), Purpose::kFeature);
  // 7: one partial block; 301: several blocks of the block fill and an odd tail.
  for (const int64_t count : {7, 301}) {
    std::vector<double> filled(count);
    stream.normals(5, 2, filled.data(), count);
    for (uint32_t t = 0; t < count; ++t) CHECK(filled[t] == stream.normal(5, t, 2));
  }
}

TEST_CASE("normals() from an offset t0 fills elements t0.. of the row bit for bit", "[rng]") {
  // Even and odd offsets, counts that end inside a Philox pair or a 64-pair block, whole blocks after an odd
  // start, and a row far along (t0 near 2^31: counters past 2^30).
  const RandomStream stream(make_random_key(2, "offset", 1), Purpose::kProjection);
  int64_t checked = 0;
  for (const uint32_t t0 : {0u, 1u, 2u, 5u, 127u, 128u, 129u, 1000u, 2147483001u}) {
    for (const int64_t count : {1, 2, 7, 64, 129, 301}) {
      INFO("t0 " << t0 << ", count " << count);
      std::vector<double> filled(count);
      stream.normals(7, 3, filled.data(), count, t0);
      for (int64_t j = 0; j < count; ++j) {
        const double expected = stream.normal(7, t0 + static_cast<uint32_t>(j), 3);
        REQUIRE(std::bit_cast<uint64_t>(filled[j]) == std::bit_cast<uint64_t>(expected));
        ++checked;
      }
    }
  }
  CHECK(checked == 9 * (1 + 2 + 7 + 64 + 129 + 301));
  // The offset fill of a long row in tiles equals the fill from 0.
  std::vector<double> whole(5000), tiles(5000);
  stream.normals(11, 0, whole.data(), 5000);
  for (uint32_t t0 = 0; t0 < 5000; t0 += 333) stream.normals(11, 0, tiles.data() + t0, std::min(333u, 5000u - t0), t0);
  CHECK(whole == tiles);
}

TEST_CASE("uniforms() fills the same numbers as uniform() over a range of positions", "[rng]") {
  const RandomStream stream(make_random_key(4, "fill", 0), Purpose::kColumnSample);
  // The vector route draws 32 counters at a time, past the count, in blocks of 64: counts that end at and
  // around those boundaries, within one block and after several (72 is Informer's budget at n = 4096).
  for (const int64_t count : {1, 8, 31, 32, 33, 63, 64, 65, 72, 200}) {
    INFO("count " << count);
    std::vector<double> filled(count);
    stream.uniforms(3, 17, 1, filled.data(), count);
    for (uint32_t j = 0; j < count; ++j) REQUIRE(filled[j] == stream.uniform(3, 17 + j, 1));
  }
}

TEST_CASE("Box-Muller's own log and sin/cos agree with libm to a few ulp", "[rng]") {
  const RandomStream stream(make_random_key(9, "libm", 0), Purpose::kGeneric);
  double worst_log = 0, worst_trig = 0;
  for (uint32_t i = 0; i < 200000; ++i) {
    const PhiloxCounter r = stream.bits(i);
    // Uniforms as Box–Muller sees them, plus tiny ones (u down to 2^-53) through the low words alone.
    for (const double u : {uint_to_unit_double(r.v[0], r.v[1]), uint_to_unit_double(0, r.v[2])}) {
      const double exact = std::log(u);
      if (exact != 0) worst_log = std::max(worst_log, std::abs(unit_log(u) - exact) / std::abs(exact));
      double s, c;
      sincos_two_pi(u, s, c);
      // Absolute error: sin(2πu) near its zeros inherits the rounding of 2π·u in libm's argument too.
      worst_trig = std::max({worst_trig, std::abs(s - std::sin(6.283185307179586476925 * u)),
                             std::abs(c - std::cos(6.283185307179586476925 * u))});
    }
  }
  CHECK(unit_log(1.0) == 0.0);
  // Observed (seed 9): relative log error 3.2e-16, absolute sin/cos error 6.9e-16.
  CHECK(worst_log < 1e-15);
  CHECK(worst_trig < 2e-15);
}

TEST_CASE("float Box-Muller's log and sin/cos agree with libm to a few float ulp", "[rng]") {
  const RandomStream stream(make_random_key(9, "libm float", 0), Purpose::kGeneric);
  double worst_log = 0, worst_trig = 0;
  auto check = [&](float u) {
    const double exact = std::log(static_cast<double>(u));
    if (exact != 0)
      worst_log = std::max(worst_log, std::abs(static_cast<double>(unit_log_f(u)) - exact) / std::abs(exact));
    float s, c;
    sincos_two_pi_f(u, s, c);
    const double angle = 6.283185307179586476925 * static_cast<double>(u);
    worst_trig = std::max({worst_trig, std::abs(s - std::sin(angle)), std::abs(c - std::cos(angle))});
  };
  for (uint32_t i = 0; i < 200000; ++i) {
    const PhiloxCounter r = stream.bits(i);
    for (const uint32_t word : r.v) check(uint_to_unit_float(word));
  }
  for (uint32_t x = 0; x < 4096; ++x) check(uint_to_unit_float(x << 8));  // the smallest uniforms, 2^-24 up
  check(1.0f);
  CHECK(unit_log_f(1.0f) == 0.0f);
  // A float ulp is 6.0e-8 to 1.2e-7 relative, 6.0e-8 absolute below 1. Observed (seed 9): relative log error
  // 1.5e-7, absolute sin/cos error 8.1e-8.
  INFO("log " << worst_log << " trig " << worst_trig);
  CHECK(worst_log < 2.5e-7);
  CHECK(worst_trig < 2.5e-7);
}

TEST_CASE("float normals have the moments of N(0, 1) and stay within the 5.77 bound", "[rng]") {
  const RandomStream stream(make_random_key(7, "float moments", 0), Purpose::kProjection);
  const int64_t count = 400000;
  std::vector<float> z(count);
  stream.float_normals(3, 1, z.data(), count);
  double sum = 0, sum2 = 0, sum4 = 0, largest = 0;
  for (const float x : z) {
    sum += x;
    sum2 += static_cast<double>(x) * x;
    sum4 += std::pow(static_cast<double>(x), 4);
    largest = std::max(largest, std::abs(static_cast<double>(x)));
  }
  // Standard errors over 400k draws: mean 1/√n = 1.6e-3, variance √(2/n) = 2.2e-3, fourth moment √(96/n) =
  // 1.5e-2 (E z⁸ − (E z⁴)² = 105 − 9). Bounds are 4 standard errors. Observed (seed 7): mean 1.9e-4, variance
  // −3.9e-3, fourth moment −1.5e-2 off; largest |z| 4.67.
  INFO("mean " << sum / count << " variance " << sum2 / count << " fourth " << sum4 / count << " max " << largest);
  CHECK(std::abs(sum / count) < 4 * 1.6e-3);
  CHECK(std::abs(sum2 / count - 1.0) < 4 * 2.2e-3);
  CHECK(std::abs(sum4 / count - 3.0) < 4 * 1.5e-2);
  CHECK(largest <= std::sqrt(48 * std::log(2.0)) + 1e-5);
  // Elements 4b … 4b + 3 come from one Philox block: within it, the two pairs are independent uniforms, so
  // their products average to 0 (standard error 1/√(n/4) = 3.2e-3; observed 1.2e-3).
  double cross = 0;
  for (int64_t b = 0; b < count / 4; ++b) cross += static_cast<double>(z[4 * b]) * z[4 * b + 2];
  INFO("cross " << cross / (count / 4));
  CHECK(std::abs(cross / (count / 4)) < 4 * 3.2e-3);
}

TEST_CASE("float_normals() fills the same numbers as float_normal() from any offset", "[rng]") {
  // Offsets at every position inside a 4-element Philox block and around the 64-block fill, counts that end
  // inside a block, whole fills after an odd start, and a row far along (counters past 2^29).
  const RandomStream stream(make_random_key(2, "float offset", 1), Purpose::kProjection);
  int64_t checked = 0;
  for (const uint32_t t0 : {0u, 1u, 2u, 3u, 5u, 255u, 256u, 257u, 1000u, 2147483001u}) {
    for (const int64_t count : {1, 2, 3, 4, 7, 64, 255, 256, 257, 301, 600}) {
      INFO("t0 " << t0 << ", count " << count);
      std::vector<float> filled(count);
      stream.float_normals(7, 3, filled.data(), count, t0);
      for (int64_t j = 0; j < count; ++j) {
        const float expected = stream.float_normal(7, t0 + static_cast<uint32_t>(j), 3);
        REQUIRE(std::bit_cast<uint32_t>(filled[j]) == std::bit_cast<uint32_t>(expected));
        ++checked;
      }
    }
  }
  CHECK(checked == 10 * 1750);
}

TEST_CASE("keys depend on seed and case and trial and purposes separate streams", "[rng]") {
  const RandomKey base = make_random_key(0, "layer=0;head=0", 0);
  CHECK(base.value == make_random_key(0, "layer=0;head=0", 0).value);
  CHECK(base.value != make_random_key(1, "layer=0;head=0", 0).value);
  CHECK(base.value != make_random_key(0, "layer=0;head=1", 0).value);
  CHECK(base.value != make_random_key(0, "layer=0;head=0", 1).value);
  const RandomStream a(base, Purpose::kNoise), b(base, Purpose::kFeature);
  CHECK(a.bits(3).v[0] != b.bits(3).v[0]);
}

TEST_CASE("sampling without replacement follows the successive-sampling law", "[rng]") {
  // Weights of 4 items; k = 2 draws. Exact law of the ordered pair (i, j):
  // P = w_i/W · w_j/(W − w_i). Compare with frequencies over many keys.
  const std::vector<double> w = {0.1, 0.2, 0.3, 0.4};
  const double total = 1.0;
  std::map<std::pair<int64_t, int64_t>, int> counts;
  const int draws = 40000;
  for (int t = 0; t < draws; ++t) {
    const RandomStream stream(make_random_key(11, "successive", t), Purpose::kColumnSample);
    const auto picked = sample_without_replacement(w, 2, stream);
    REQUIRE(picked.size() == 2);
    REQUIRE(picked[0] != picked[1]);
    counts[{picked[0], picked[1]}]++;
  }
  double worst_z = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      if (i == j) continue;
      const double p = w[i] / total * w[j] / (total - w[i]);
      const double freq = counts[{i, j}] / static_cast<double>(draws);
      const double se = std::sqrt(p * (1 - p) / draws);
      worst_z = std::max(worst_z, std::abs(freq - p) / se);
    }
  // 12 ordered pairs, each a binomial proportion; max |z| over 12 under the law is < 4 with
  // probability > 0.999. Observed (seed 11): 2.08.
  CHECK(worst_z < 4.0);
}

TEST_CASE("sampling with replacement follows the weights and never draws a zero weight", "[rng]") {
  const std::vector<double> w = {0.0, 1.0, 3.0, 0.0, 4.0};
  const RandomStream stream(make_random_key(5, "with", 0), Purpose::kRowSample);
  const int draws = 400000;
  const auto picked = sample_with_replacement(w, draws, stream);
  std::vector<int> counts(w.size());
  for (int64_t j : picked) counts[j]++;
  CHECK(counts[0] == 0);
  CHECK(counts[3] == 0);
  for (int j : {1, 2, 4}) {
    const double p = w[j] / 8.0;
    const double se = std::sqrt(p * (1 - p) / draws);
    // 4 standard errors. Observed (seed 5): z = -1.64, 0.62, 0.48 for items 1, 2, 4 (and |z| < 1.7 at
    // 2M draws for seeds 5..7: no bias).
    const double z = (counts[j] / static_cast<double>(draws) - p) / se;
    INFO("item " << j << " z " << z);
    CHECK(std::abs(z) < 4);
  }
  CHECK_THROWS(sample_with_replacement({0.0, 0.0}, 1, stream));
  CHECK_THROWS(sample_without_replacement({1.0, std::nan("")}, 1, stream));
}

TEST_CASE("uniform sampling without replacement returns at most n distinct indices", "[rng]") {
  const RandomStream stream(make_random_key(2, "uniform", 0), Purpose::kColumnSample);
  auto picked = sample_uniform_without_replacement(10, 10, stream);
  std::sort(picked.begin(), picked.end());
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  CHECK(picked == all);
  CHECK(sample_uniform_without_replacement(10, 25, stream).size() == 10);
}
