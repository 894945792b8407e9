#include "attnprobe/rng/random_stream.h"

#include <algorithm>
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
// dependence between iterations, which the compiler turns into vector code (-march=native: 32×32→64
// products as vpmuludq, the Box–Muller arithmetic of philox.h in 8 double lanes). Per block the words go
// through small stack arrays (4 KiB in all), so nothing is allocated.
constexpr int64_t kBlock = 64;

// Words of the Philox blocks at counters (a, b0 + j, c, purpose), j < count ≤ kBlock.
void philox_words(PhiloxKey key, uint32_t a, uint32_t b0, uint32_t c, uint32_t purpose, int64_t count,
                  uint32_t (&w0)[kBlock], uint32_t (&w1)[kBlock], uint32_t (&w2)[kBlock], uint32_t (&w3)[kBlock]) {
  for (int64_t j = 0; j < count; ++j) {
    uint32_t c0 = a, c1 = b0 + static_cast<uint32_t>(j), c2 = c, c3 = purpose;
    uint32_t k0 = key.v[0], k1 = key.v[1];
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {
      const uint64_t p0 = static_cast<uint64_t>(philox_detail::kMul0) * c0;
      const uint64_t p1 = static_cast<uint64_t>(philox_detail::kMul1) * c2;
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
      c1 = static_cast<uint32_t>(p1);
      c3 = static_cast<uint32_t>(p0);
      c0 = n0;
      c2 = n2;
      k0 += philox_detail::kWeyl0;
      k1 += philox_detail::kWeyl1;
    }
    w0[j] = c0;
    w1[j] = c1;
    w2[j] = c2;
    w3[j] = c3;
  }
}

template <typename T>
void fill_normals(PhiloxKey key, uint32_t purpose, uint32_t a, uint32_t c, T* out, int64_t count) {
  uint32_t w0[kBlock], w1[kBlock], w2[kBlock], w3[kBlock];
  double first[kBlock], second[kBlock];
  const int64_t pairs = (count + 1) / 2;
  for (int64_t b = 0; b < pairs; b += kBlock) {
    const int64_t m = std::min(kBlock, pairs - b);
    philox_words(key, a, static_cast<uint32_t>(b), c, purpose, m, w0, w1, w2, w3);
    for (int64_t j = 0; j < m; ++j)
      box_muller(uint_to_unit_double(w0[j], w1[j]), uint_to_unit_double(w2[j], w3[j]), first[j], second[j]);
    T* dst = out + 2 * b;
    const int64_t values = std::min<int64_t>(2 * m, count - 2 * b);
    for (int64_t t = 0; t < values; ++t) dst[t] = static_cast<T>(t & 1 ? second[t >> 1] : first[t >> 1]);
  }
}
}  // namespace

// The key schedule above must be the one of philox4x32_10 (key bumped before every round but the
// first): bumping after each round instead, and for all 10, gives the same keys to rounds 1..9 and an
// unused bump after the last.
void RandomStream::normals(uint32_t a, uint32_t c, double* out, int64_t count) const {
  fill_normals(key_, purpose_, a, c, out, count);
}

void RandomStream::normals(uint32_t a, uint32_t c, float* out, int64_t count) const {
  fill_normals(key_, purpose_, a, c, out, count);
}

void RandomStream::uniforms(uint32_t a, uint32_t b0, uint32_t c, double* out, int64_t count) const {
  uint32_t w0[kBlock], w1[kBlock], w2[kBlock], w3[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t m = std::min(kBlock, count - b);
    philox_words(key_, a, b0 + static_cast<uint32_t>(b), c, purpose_, m, w0, w1, w2, w3);
    for (int64_t j = 0; j < m; ++j) out[b + j] = uint_to_unit_double(w0[j], w1[j]);
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
