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
}  // namespace

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
  for (int64_t j = 0; j < n; ++j) {
    if (weights[j] <= 0) continue;
    // log(u)/w is the log of the Efraimidis–Spirakis key u^(1/w); the largest keys win.
    keyed.emplace_back(std::log(stream.uniform(row, static_cast<uint32_t>(j))) / weights[j], j);
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
