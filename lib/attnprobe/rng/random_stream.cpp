#include "attnprobe/rng/random_stream.h"

#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <numeric>
#include <stdexcept>

#include "attnprobe/common/text.h"

namespace attnprobe {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void check_weights(const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) {
    if (!(w >= 0) || !std::isfinite(w)) throw std::invalid_argument("sampling weights must be finite and >= 0");
    total += w;
  }
  if (!(total > 0)) throw std::invalid_argument("sampling weights are all zero");
}

// Draws are made kBlock Philox counters at a time: each step below is a loop over the block with no
// dependence between iterations. Per block the words go through small stack arrays (2 KiB in all), so
// nothing is allocated.
//  - The Philox rounds: with AVX-512 written out in intrinsics, 8 counters per register in 64-bit lanes
//    (vpmuludq gives the whole 32×32→64 product, whose high half is one shift away) and 4 registers in
//    flight to hide the multiply's latency; GCC's own vectorisation of the scalar loop widened the words
//    with vpmovzxdq and multiplied with vpmullq (1.5 ns per normal against 0.9). Integer arithmetic, so the
//    words are those of philox4x32_10 whatever the route (the known-answer and fill tests check it).
//  - Box–Muller (philox.h) stays the compiler's vectorisation of the same C++ as normal(), so every
//    rounding and every a·b + c contraction is the scalar one; -O3 -march=native, 8 double lanes; with
//    -fno-math-errno so sqrt vectorises.
//  - The pairs are interleaved into the output with two-source permutes (GCC's version of the
//    interleaving loop gathered).
// One run on a Zen 4 core (load ~2): 2.4 ns per normal against 4.4 before this change (Philox 0.9, Box–Muller
// 1.5, the latter bound by the FMA pipe and its division and square root).
constexpr int64_t kBlock = 64;

#if defined(__AVX512F__)
// The Philox rounds on 4 × 8 counters (a, b0 + j, c, purpose), j < 32, in the low halves of 64-bit lanes
// (the high halves carry junk that vpmuludq ignores and the callers mask): w0..w3[g] hold the four words of
// counters 8g … 8g + 7.
void philox_rounds32(PhiloxKey key, uint32_t a, uint32_t b0, uint32_t c, uint32_t purpose, __m512i (&w0)[4],
                     __m512i (&w1)[4], __m512i (&w2)[4], __m512i (&w3)[4]) {
  const __m512i mul0 = _mm512_set1_epi64(philox_detail::kMul0), mul1 = _mm512_set1_epi64(philox_detail::kMul1);
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  for (int g = 0; g < 4; ++g) {
    w0[g] = _mm512_set1_epi64(a);
    w1[g] = _mm512_add_epi64(_mm512_set1_epi64(b0 + 8u * g), lane);  // only the low 32 bits count: wraps as uint32
    w2[g] = _mm512_set1_epi64(c);
    w3[g] = _mm512_set1_epi64(purpose);
  }
  uint32_t k0 = key.v[0], k1 = key.v[1];
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {  // the key is bumped before every round but the first, as in philox4x32_10
    const __m512i key0 = _mm512_set1_epi64(k0), key1 = _mm512_set1_epi64(k1);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const __m512i p0 = _mm512_mul_epu32(w0[g], mul0), p1 = _mm512_mul_epu32(w2[g], mul1);
      w0[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), w1[g], key0, 0x96);  // 0x96: a ^ b ^ c
      w2[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), w3[g], key1, 0x96);
      w1[g] = p1;
      w3[g] = p0;
    }
    k0 += philox_detail::kWeyl0;
    k1 += philox_detail::kWeyl1;
  }
}

// The two uniform doubles of the counters (a, b0 + j, c, purpose), j < 32: u1[j] from words 0 and 1, u2[j]
// from words 2 and 3, as uint_to_unit_double makes them.
void unit_pairs32(PhiloxKey key, uint32_t a, uint32_t b0, uint32_t c, uint32_t purpose, double* u1, double* u2) {
  __m512i w0[4], w1[4], w2[4], w3[4];
  philox_rounds32(key, a, b0, c, purpose, w0, w1, w2, w3);
  // (hi << 32 | lo) >> 11 is below 2^53, so the conversion is exact and (x + 1)·2^-53 rounds as the scalar one.
  const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFFll);
  const __m512d one = _mm512_set1_pd(1.0), ulp = _mm512_set1_pd(1.0 / 9007199254740992.0);
  auto unit = [&](__m512i hi, __m512i lo) {
    const __m512i bits = _mm512_srli_epi64(_mm512_or_si512(_mm512_slli_epi64(hi, 32), _mm512_and_si512(lo, low32)), 11);
    return _mm512_mul_pd(_mm512_add_pd(_mm512_cvtepi64_pd(bits), one), ulp);
  };
  for (int g = 0; g < 4; ++g) {
    _mm512_storeu_pd(u1 + 8 * g, unit(w0[g], w1[g]));
    _mm512_storeu_pd(u2 + 8 * g, unit(w2[g], w3[g]));
  }
}

// The four uniform floats of the counters (a, b0 + j, c, purpose), j < 32: u[i][j] from word i, as
// uint_to_unit_float makes them ((x >> 8) + 1 < 2^24 + 1 converts exactly).
void float_units32(PhiloxKey key, uint32_t a, uint32_t b0, uint32_t c, uint32_t purpose, float* const (&u)[4]) {
  __m512i w[4][4];
  philox_rounds32(key, a, b0, c, purpose, w[0], w[1], w[2], w[3]);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256 ulp = _mm256_set1_ps(1.0f / 16777216.0f);
  for (int word = 0; word < 4; ++word)
    for (int g = 0; g < 4; ++g) {
      const __m256i x = _mm512_cvtepi64_epi32(w[word][g]);  // the low 32 bits of each lane
      _mm256_storeu_ps(u[word] + 8 * g,
                       _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srli_epi32(x, 8), one)), ulp));
    }
}
#endif

// u[i][j] = uint_to_unit_float(word i) of the Philox blocks at counters (a, b0 + j, c, purpose), j < count ≤
// kBlock; each u[i] holds kBlock values (the vector route may fill past count).
void float_units(PhiloxKey key, uint32_t a, uint32_t b0, uint32_t c, uint32_t purpose, int64_t count,
                 float* const (&u)[4]) {
#if defined(__AVX512F__)
  for (int64_t j = 0; j < count; j += 32) {
    float* const part[4] = {u[0] + j, u[1] + j, u[2] + j, u[3] + j};
    float_units32(key, a, b0 + static_cast<uint32_t>(j), c, purpose, part);
  }
#else
  for (int64_t j = 0; j < count; ++j) {
    const PhiloxCounter r = philox4x32_10(PhiloxCounter{{a, b0 + static_cast<uint32_t>(j), c, purpose}}, key);
    for (int i = 0; i < 4; ++i) u[i][j] = uint_to_unit_float(r.v[i]);
  }
#endif
}

// u1[j], u2[j] for the Philox blocks at counters (a, b0 + j, c, purpose), j < count ≤ kBlock; u1 and u2
// hold kBlock values (the vector route may fill past count).
void unit_pairs(PhiloxKey key, uint32_t a, uint32_t b0, uint32_t c, uint32_t purpose, int64_t count, double* u1,
                double* u2) {
#if defined(__AVX512F__)
  for (int64_t j = 0; j < count; j += 32)
    unit_pairs32(key, a, b0 + static_cast<uint32_t>(j), c, purpose, u1 + j, u2 + j);
#else
  for (int64_t j = 0; j < count; ++j) {
    const PhiloxCounter r = philox4x32_10(PhiloxCounter{{a, b0 + static_cast<uint32_t>(j), c, purpose}}, key);
    u1[j] = uint_to_unit_double(r.v[0], r.v[1]);
    u2[j] = uint_to_unit_double(r.v[2], r.v[3]);
  }
#endif
}

// out[t] = element t0 + t of the normal sequence of row (a, c), t < count: Box–Muller pair t/2 gives
// elements t (even, the cosine) and t + 1 (the sine).
void fill_normals(PhiloxKey key, uint32_t purpose, uint32_t a, uint32_t c, uint32_t t0, double* out, int64_t count) {
  static_assert(kBlock % 32 == 0, "the vector route fills 32 pairs at a time");
  alignas(64) double u1[kBlock], u2[kBlock], first[kBlock], second[kBlock];
  const int64_t begin = t0, end = begin + count;  // element indices
  for (int64_t pair = begin >> 1; 2 * pair < end; pair += kBlock) {
    const int64_t m = std::min(kBlock, (end + 1) / 2 - pair);
    unit_pairs(key, a, static_cast<uint32_t>(pair), c, purpose, m, u1, u2);
    for (int64_t j = 0; j < m; ++j) box_muller(u1[j], u2[j], first[j], second[j]);
    const int64_t lo = std::max(2 * pair, begin), hi = std::min(2 * pair + 2 * m, end);  // elements of this block
#if defined(__AVX512F__)
    if (lo == 2 * pair && hi == 2 * pair + 2 * kBlock) {  // a whole block: interleave 8 pairs per permute pair
      double* dst = out + (lo - begin);
      const __m512i even = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0),
                    odd = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
      for (int64_t j = 0; j < kBlock; j += 8) {
        const __m512d f = _mm512_load_pd(first + j), s = _mm512_load_pd(second + j);
        const __m512d x = _mm512_permutex2var_pd(f, even, s), y = _mm512_permutex2var_pd(f, odd, s);
        _mm512_storeu_pd(dst + 2 * j, x);
        _mm512_storeu_pd(dst + 2 * j + 8, y);
      }
      continue;
    }
#endif
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t j = (t >> 1) - pair;
      out[t - begin] = t & 1 ? second[j] : first[j];
    }
  }
}

// out[t] = element t0 + t of the float normal sequence of row (a, c), t < count: block b gives elements 4b
// … 4b + 3, box_muller_f on words (0, 1) and on words (2, 3).
void fill_float_normals(PhiloxKey key, uint32_t purpose, uint32_t a, uint32_t c, uint32_t t0, float* out,
                        int64_t count) {
  alignas(64) float u0[kBlock], u1[kBlock], u2[kBlock], u3[kBlock];
  alignas(64) float first_a[kBlock], second_a[kBlock], first_b[kBlock], second_b[kBlock];
  float* const units[4] = {u0, u1, u2, u3};
  const int64_t begin = t0, end = begin + count;  // element indices
  for (int64_t block = begin >> 2; 4 * block < end; block += kBlock) {
    const int64_t m = std::min(kBlock, (end + 3) / 4 - block);
    float_units(key, a, static_cast<uint32_t>(block), c, purpose, m, units);
    for (int64_t j = 0; j < m; ++j) box_muller_f(u0[j], u1[j], first_a[j], second_a[j]);
    for (int64_t j = 0; j < m; ++j) box_muller_f(u2[j], u3[j], first_b[j], second_b[j]);
    const int64_t lo = std::max(4 * block, begin), hi = std::min(4 * block + 4 * m, end);  // elements of this block
#if defined(__AVX512F__)
    if (lo == 4 * block && hi == 4 * block + 4 * kBlock) {  // a whole block: 16 quads per four registers
      float* dst = out + (lo - begin);
      for (int64_t j = 0; j < kBlock; j += 16) {
        const __m512 fa = _mm512_load_ps(first_a + j), sa = _mm512_load_ps(second_a + j),
                     fb = _mm512_load_ps(first_b + j), sb = _mm512_load_ps(second_b + j);
        // Within each 128-bit lane L: x0 = (fa, sa) of quads 4L, 4L + 1, x1 of 4L + 2, 4L + 3 (y: fb, sb);
        // then q_i holds quad 4L + i whole in lane L; the lanes are then gathered in quad order.
        const __m512d x0 = _mm512_castps_pd(_mm512_unpacklo_ps(fa, sa)),
                      x1 = _mm512_castps_pd(_mm512_unpackhi_ps(fa, sa));
        const __m512d y0 = _mm512_castps_pd(_mm512_unpacklo_ps(fb, sb)),
                      y1 = _mm512_castps_pd(_mm512_unpackhi_ps(fb, sb));
        const __m512 q0 = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, y0)),
                     q1 = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, y0));
        const __m512 q2 = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, y1)),
                     q3 = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, y1));
        const __m512 low01 = _mm512_shuffle_f32x4(q0, q1, 0x44), low23 = _mm512_shuffle_f32x4(q2, q3, 0x44);
        const __m512 high01 = _mm512_shuffle_f32x4(q0, q1, 0xee), high23 = _mm512_shuffle_f32x4(q2, q3, 0xee);
        _mm512_storeu_ps(dst + 4 * j, _mm512_shuffle_f32x4(low01, low23, 0x88));         // quads 0–3
        _mm512_storeu_ps(dst + 4 * j + 16, _mm512_shuffle_f32x4(low01, low23, 0xdd));    // quads 4–7
        _mm512_storeu_ps(dst + 4 * j + 32, _mm512_shuffle_f32x4(high01, high23, 0x88));  // quads 8–11
        _mm512_storeu_ps(dst + 4 * j + 48, _mm512_shuffle_f32x4(high01, high23, 0xdd));  // quads 12–15
      }
      continue;
    }
#endif
    const float* const parts[4] = {first_a, second_a, first_b, second_b};
    for (int64_t t = lo; t < hi; ++t) out[t - begin] = parts[t & 3][(t >> 2) - block];
  }
}
}  // namespace

void RandomStream::float_normals(uint32_t a, uint32_t c, float* out, int64_t count, uint32_t t0) const {
  fill_float_normals(key_, purpose_, a, c, t0, out, count);
}

void RandomStream::normals(uint32_t a, uint32_t c, double* out, int64_t count, uint32_t t0) const {
  fill_normals(key_, purpose_, a, c, t0, out, count);
}

void RandomStream::uniforms(uint32_t a, uint32_t b0, uint32_t c, double* out, int64_t count) const {
  alignas(64) double u1[kBlock], u2[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t m = std::min(kBlock, count - b);
    unit_pairs(key_, a, b0 + static_cast<uint32_t>(b), c, purpose_, m, u1, u2);
    std::copy(u1, u1 + m, out + b);
  }
}

RandomKey make_random_key(uint64_t seed, uint64_t case_hash, uint32_t trial) {
  uint64_t k = splitmix64(seed);
  k = splitmix64(k ^ case_hash);
  k = splitmix64(k ^ (static_cast<uint64_t>(trial) * 0xd1b54a32d192ed03ULL));
  return RandomKey{k};
}

RandomKey make_random_key(uint64_t seed, std::string_view case_id, uint32_t trial) {
  return make_random_key(seed, stable_hash(case_id), trial);
}

std::vector<int64_t> sample_with_replacement(const std::vector<double>& weights, int64_t count,
                                             const RandomStream& stream, uint32_t row) {
  check_weights(weights);
  std::vector<double> cumulative(weights.size());
  std::partial_sum(weights.begin(), weights.end(), cumulative.begin());
  const double total = cumulative.back();
  std::vector<int64_t> out(count);
  for (int64_t s = 0; s < count; ++s) {
    double target = stream.uniform(row, static_cast<uint32_t>(s)) * total;
    // First index whose cumulative weight reaches the target; u in (0,1] so target > 0 and a
    // zero-weight item (equal cumulative to its predecessor) can never be chosen.
    auto it = std::lower_bound(cumulative.begin(), cumulative.end(), target);
    int64_t j = std::min<int64_t>(it - cumulative.begin(), static_cast<int64_t>(weights.size()) - 1);
    while (weights[j] == 0 && j > 0) --j;  // guards the rounding case target == total
    out[s] = j;
  }
  return out;
}

std::vector<int64_t> sample_without_replacement(const std::vector<double>& weights, int64_t count,
                                                const RandomStream& stream, uint32_t row) {
  check_weights(weights);
  const int64_t n = static_cast<int64_t>(weights.size());
  std::vector<std::pair<double, int64_t>> keyed;
  keyed.reserve(n);
  std::vector<double> u(n);
  stream.uniforms(row, 0, 0, u.data(), n);
  for (int64_t j = 0; j < n; ++j) {
    if (weights[j] <= 0) continue;
    // log(u)/w is the log of the Efraimidis–Spirakis key u^(1/w); the largest keys win.
    keyed.emplace_back(std::log(u[j]) / weights[j], j);
  }
  const int64_t k = std::min<int64_t>(count, static_cast<int64_t>(keyed.size()));
  auto by_key = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(keyed.begin(), keyed.begin() + k, keyed.end(), by_key);
  std::vector<int64_t> out(k);
  for (int64_t i = 0; i < k; ++i) out[i] = keyed[i].second;
  return out;
}

std::vector<int64_t> sample_uniform_without_replacement(int64_t n, int64_t count, const RandomStream& stream,
                                                        uint32_t row) {
  return sample_without_replacement(std::vector<double>(n, 1.0), count, stream, row);
}

}  // namespace attnprobe
