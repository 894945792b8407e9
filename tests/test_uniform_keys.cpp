// uniform_keys against its definition (docs/estimators/sampling.md): the sample is a Bernoulli(π) process
// (inclusion frequencies and sizes over seeds), the estimate equals a float64 computation written from the
// spec's formulas and draws, N̂ and D̂ are unbiased, and b ≥ |V_t| is exact (full and causal).
#include <cmath>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sampling/uniform_keys/uniform_keys.h"
#include "attnprobe/exact/exact_attention.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// The spec's draws, written from its text: row t keeps key 0 + G_0, then +1 + G_s, G_s = ⌊log u_{t,s} / log(1 − π)⌋.
std::vector<int64_t> spec_sample(int64_t visible, int64_t b, const RandomStream& stream, int64_t t) {
  const double pi = std::min(1.0, double(b) / double(visible));
  std::vector<int64_t> kept;
  if (pi == 1.0) {
    for (int64_t j = 0; j < visible; ++j) kept.push_back(j);
    return kept;
  }
  int64_t position = -1;
  for (uint32_t s = 0;; ++s) {
    position += 1 + int64_t(std::floor(std::log(stream.uniform(uint32_t(t), s)) / std::log(1.0 - pi)));
    if (position >= visible) return kept;
    kept.push_back(position);
  }
}

// N̂_t (pv) and D̂_t of the spec in float64: Σ_S e^{ℓ_j}·v_j / π and Σ_S e^{ℓ_j} / π.
void spec_sums(const HeadView& view, int64_t t, int64_t b, const RandomStream& stream, RowVectorD& num, double& den) {
  const int64_t visible = view.mask == Mask::kCausal ? t + 1 : view.n();
  const double pi = std::min(1.0, double(b) / double(visible));
  num = RowVectorD::Zero(view.pv());
  den = 0;
  for (const int64_t j : spec_sample(visible, b, stream, t)) {
    const double e = std::exp(view.scale * view.q.row(t).dot(view.k.row(j)));
    num += e * view.v.row(j) / pi;
    den += e / pi;
  }
}

}  // namespace

TEST_CASE("uniform_keys keeps each key with probability b/keys, independently", "[uniform_keys][statistics]") {
  // 200 keys, b = 30: π = 0.15. Over 4000 seeds each key's frequency is binomial(4000, 0.15) and the sample
  // size binomial(200, 0.15) per draw; pairs of keys are independent (their joint frequency π²).
  const int64_t keys = 200, b = 30, seeds = 4000;
  const double pi = 0.15;
  std::vector<int64_t> hits(keys, 0);
  int64_t both = 0, sizes = 0;
  for (int64_t seed = 0; seed < seeds; ++seed) {
    const RandomStream stream(make_random_key(seed, "uniform_keys sample", 0), Purpose::kColumnSample);
    double inclusion = 0;
    const auto sample = uniform_keys_sample(keys, b, stream, 7, &inclusion);
    REQUIRE(inclusion == pi);
    REQUIRE(sample == spec_sample(keys, b, stream, 7));  // the draws the spec states
    REQUIRE(std::is_sorted(sample.begin(), sample.end()));
    for (const int64_t j : sample) ++hits[j];
    both += std::count(sample.begin(), sample.end(), 3) * std::count(sample.begin(), sample.end(), 150);
    sizes += static_cast<int64_t>(sample.size());
  }
  double worst = 0;
  for (const int64_t h : hits) worst = std::max(worst, std::abs(h - seeds * pi) / std::sqrt(seeds * pi * (1 - pi)));
  const double size_z = (double(sizes) / seeds - keys * pi) / std::sqrt(keys * pi * (1 - pi) / seeds);
  const double pair_z = (both - seeds * pi * pi) / std::sqrt(seeds * pi * pi * (1 - pi * pi));
  INFO("largest |z| of 200 inclusion frequencies " << worst << ", size z " << size_z << ", pair z " << pair_z);
  CHECK(worst < 4.5);             // observed 2.70 (the largest of 200)
  CHECK(std::abs(size_z) < 4.5);  // observed 0.066
  CHECK(std::abs(pair_z) < 4.5);  // observed 0.43
}

TEST_CASE("uniform_keys equals the spec's formula in float64, full and causal", "[uniform_keys]") {
  for (const Mask mask : {Mask::kFull, Mask::kCausal}) {
    HeadView view = synth_slice(150, 16, 0.5, 4, 12);
    view.mask = mask;
    const std::string spec = "uniform_keys(b=20)";
    const RandomKey key = make_random_key(3, spec, 0);
    MatrixF out;
    parse_spec(spec).make()->estimate(view, EstimateContext{key, nullptr}, out);
    const RandomStream stream(key, Purpose::kColumnSample);
    double worst = 0;
    int empty = 0, zero_rows = 0;
    for (int64_t t = 0; t < view.n(); ++t) {
      RowVectorD num;
      double den = 0;
      spec_sums(view, t, 20, stream, num, den);
      if (den == 0) {  // an empty sample: the zero row
        ++empty;
        zero_rows += out.row(t).norm() == 0;
        continue;
      }
      const RowVectorD expected = num / den;
      worst = std::max(worst, (out.row(t).cast<double>() - expected).norm() / expected.norm());
    }
    INFO(mask_name(mask) << ": largest relative row error " << worst);
    CHECK(worst < 1e-5);  // float32 rounding: observed 1.9e-7 (full), 2.4e-7 (causal)
    // Under the causal mask the first 20 rows see ≤ 20 keys and keep them all (π = 1): exact there.
    if (mask == Mask::kCausal) {
      const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, Mask::kCausal);
      CHECK((out.topRows(20).cast<double>() - exact.topRows(20)).norm() < 1e-5 * exact.topRows(20).norm());
    }
    CHECK(zero_rows == empty);
  }
}

TEST_CASE("uniform_keys' numerator and denominator are unbiased", "[uniform_keys][statistics]") {
  // Horvitz–Thompson: E[D̂_t] = D_t, E[N̂_t] = N_t. 2000 seeds at b = 8 of 64 keys, rows 5 and 40.
  HeadView view = synth_slice(64, 8, 0.5, 6, 6);
  const int seeds = 2000;
  for (const int64_t t : {int64_t{5}, int64_t{40}}) {
    double den_sum = 0, den_sq = 0;
    RowVectorD num_sum = RowVectorD::Zero(view.pv()), num_sq = RowVectorD::Zero(view.pv());
    for (int seed = 0; seed < seeds; ++seed) {
      const RandomStream stream(make_random_key(seed, "uniform_keys(b=8)", 0), Purpose::kColumnSample);
      RowVectorD num;
      double den = 0;
      spec_sums(view, t, 8, stream, num, den);
      den_sum += den, den_sq += den * den;
      num_sum += num, num_sq += num.cwiseProduct(num);
    }
    double den_true = 0;
    RowVectorD num_true = RowVectorD::Zero(view.pv());
    for (int64_t j = 0; j < view.n(); ++j) {
      const double e = std::exp(view.scale * view.q.row(t).dot(view.k.row(j)));
      den_true += e, num_true += e * view.v.row(j);
    }
    auto z = [&](double sum, double sq, double truth) {
      const double mean = sum / seeds, var = sq / seeds - mean * mean;
      return (mean - truth) / std::sqrt(var / seeds);
    };
    double worst = std::abs(z(den_sum, den_sq, den_true));
    for (int64_t c = 0; c < view.pv(); ++c) worst = std::max(worst, std::abs(z(num_sum(c), num_sq(c), num_true(c))));
    INFO("row " << t << ": largest |z| of D̂ and the " << view.pv() << " entries of N̂: " << worst);
    CHECK(worst < 4.5);  // observed 2.9 (row 5), 2.0 (row 40)
  }
}

TEST_CASE("uniform_keys with b at least the keys is exact attention", "[uniform_keys]") {
  for (const Mask mask : {Mask::kFull, Mask::kCausal}) {
    HeadView view = synth_slice(90, 16, 0.3, 2, 10);
    view.mask = mask;
    const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, mask);
    const MatrixF out = run_estimator("uniform_keys(b=90)", view);
    const double error = (out.cast<double>() - exact).norm() / exact.norm();
    INFO(mask_name(mask) << " relative error " << error);
    CHECK(error < 1e-6);  // float32 rounding: observed 1.7e-7 (full), 1.1e-7 (causal)
  }
}
