// The sampling members of the decode family (docs/estimators/sampling_decode.md) — oracle_sample, magicpig,
// vattention — against float64 implementations written here from their definitions (the same keyed draws,
// reproduced from the documented purposes and indices), and their statistics over seeds: N̂ and D̂ unbiased where
// the weights are exact corrections, the ratio's bias visible and shrinking with the budget, oracle sampling's
// D̂ = D, MagicPIG's inclusion frequencies against π_j, and the sampling metrics (den_rel, num_rel, eps_cover, pilot).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sampling/magicpig/magicpig.h"
#include "attnprobe/estimators/sampling/vattention/vattention.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/selection_metrics.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// ---- the definitions, in float64 ---------------------------------------------------------------------------

// Logits are float64 sums of the float32 inputs (what the estimators score with).
double logit(const HeadView& view, int64_t i, int64_t j) {
  return view.scale * view.qf.row(i).cast<double>().dot(view.kf.row(j).cast<double>());
}

// The keys row i sees (causal: 0..t; full: all).
std::vector<int64_t> seen_keys(const HeadView& view, int64_t i) {
  const int64_t hi = view.mask == Mask::kFull ? view.keys() : std::min(view.position(i) + 1, view.keys());
  std::vector<int64_t> keys(hi);
  std::iota(keys.begin(), keys.end(), 0);
  return keys;
}

// A row's estimate in core form: keys with log-weights, each as e^{ℓ_j − M + ω_j} (M = the row's largest logit
// over the keys it sees), so D̂·e^{−M} and N̂·e^{−M}; and the exact D·e^{−M}, N·e^{−M}.
struct RowSums {
  double den = 0;
  RowVectorD num;
};
RowSums estimated_sums(const HeadView& view, int64_t i, const KeptKeys& kept) {
  const auto seen = seen_keys(view, i);
  double top = -INFINITY;
  for (int64_t j : seen) top = std::max(top, logit(view, i, j));
  RowSums s{0, RowVectorD::Zero(view.pv())};
  for (size_t r = 0; r < kept.keys.size(); ++r) {
    const double w =
        std::exp(logit(view, i, kept.keys[r]) - top + (kept.log_weights.empty() ? 0 : kept.log_weights[r]));
    s.den += w;
    s.num += w * view.vf.row(kept.keys[r]).cast<double>();
  }
  return s;
}
RowSums exact_sums(const HeadView& view, int64_t i) {
  KeptKeys all{seen_keys(view, i), {}, 0};
  return estimated_sums(view, i, all);
}

EstimateContext context(const std::string& spec, uint32_t trial, uint64_t seed = 8) {
  return {make_random_key(seed, parse_spec(spec).canonical(), trial), nullptr};
}

// A decode view: `q` (rows × p) against `k`, `v` at the last positions, under `mask`.
HeadView decode_view(const HeadView& whole, int64_t rows) { return last_rows(whole, rows); }

// oracle_sample: b iid draws by inverse CDF on the uniform at (t, u) of kColumnSample, w_j = c_j/(b·a_j).
KeptKeys oracle_sample_row(const HeadView& view, int64_t i, int64_t b, RandomKey key) {
  const auto seen = seen_keys(view, i);
  std::vector<double> cumulative(seen.size());
  double top = -INFINITY;
  for (int64_t j : seen) top = std::max(top, logit(view, i, j));
  double total = 0;
  for (size_t r = 0; r < seen.size(); ++r) cumulative[r] = total += std::exp(logit(view, i, seen[r]) - top);
  const RandomStream stream(key, Purpose::kColumnSample);
  std::vector<int64_t> count(seen.size(), 0);
  for (int64_t u = 0; u < b; ++u) {
    const double target = stream.uniform(static_cast<uint32_t>(view.position(i)), static_cast<uint32_t>(u)) * total;
    ++count[std::lower_bound(cumulative.begin(), cumulative.end(), target) - cumulative.begin()];
  }
  KeptKeys kept;
  for (size_t r = 0; r < seen.size(); ++r)
    if (count[r] > 0) {
      const double a = std::exp(logit(view, i, seen[r]) - top) / total;
      kept.keys.push_back(seen[r]);
      kept.log_weights.push_back(std::log(static_cast<double>(count[r]) / (static_cast<double>(b) * a)));
    }
  return kept;
}

// P(Binomial(L, p) ≥ m) by summing every pmf term from m up (C(L, k) as a running product), no cancellation for
// small p.
double binomial_tail(double p, int64_t L, int64_t m) {
  double sum = 0, choose = 1;
  for (int64_t k = 0; k <= L; ++k) {
    if (k > 0) choose *= static_cast<double>(L - k + 1) / static_cast<double>(k);
    if (k >= m) sum += choose * std::pow(p, k) * std::pow(1 - p, L - k);
  }
  return sum;
}

struct PigParams {
  int64_t K, L, sink, window, min;
  double floor;
  bool prefill;  ///< anchor=prefill (else row)
  bool center;
};

// magicpig from the definition: hyperplane f = l·K + b is normal row f of kHashProjection (element d = coordinate);
// codes of q and of the centred keys; S_t = the keys with ≥ min collisions; ω_j = −log(π_j + floor).
KeptKeys magicpig_row(const HeadView& view, int64_t i, const PigParams& o, RandomKey key) {
  const int64_t p = view.p(), t = view.position(i), P = view.first_position;
  const RandomStream stream(key, Purpose::kHashProjection);
  const bool full = view.mask == Mask::kFull;
  const int64_t sink = full ? 0 : o.sink, window = full ? 0 : o.window;
  int64_t hb = sink, he = full ? view.keys() : (o.prefill ? P - window + 1 : t - window + 1);
  he = std::max(hb, he);
  RowVectorD centre = RowVectorD::Zero(p);
  if (o.center && he > hb) {
    for (int64_t j = hb; j < he; ++j) centre += view.kf.row(j).cast<double>();
    centre /= static_cast<double>(he - hb);
  }
  MatrixD planes(o.K * o.L, p);
  for (int64_t f = 0; f < o.K * o.L; ++f)
    for (int64_t d = 0; d < p; ++d) planes(f, d) = stream.normal(static_cast<uint32_t>(f), static_cast<uint32_t>(d));
  const RowVectorD q = view.qf.row(i).cast<double>();
  auto code = [&](const RowVectorD& x, int64_t l) {
    uint32_t c = 0;
    for (int64_t b = 0; b < o.K; ++b) c |= static_cast<uint32_t>(x.dot(planes.row(l * o.K + b)) > 0) << b;
    return c;
  };
  KeptKeys kept;
  for (int64_t j : seen_keys(view, i)) {
    if (j < hb || j >= he) {  // the exact part
      kept.keys.push_back(j);
      kept.log_weights.push_back(0);
      continue;
    }
    const RowVectorD x = view.kf.row(j).cast<double>() - centre;
    int64_t collisions = 0;
    for (int64_t l = 0; l < o.L; ++l) collisions += code(q, l) == code(x, l);
    if (collisions < o.min) continue;
    // θ = π/2 for a zero vector (a lone hashed key is its own centre).
    const double cosine = q.norm() * x.norm() > 0 ? q.dot(x) / (q.norm() * x.norm()) : 0.0;
    const double prob = std::pow(1 - std::acos(std::clamp(cosine, -1.0, 1.0)) / std::numbers::pi, o.K);
    kept.keys.push_back(j);
    kept.log_weights.push_back(-std::log(binomial_tail(prob, o.L, o.min) + o.floor));
  }
  return kept;
}

// vattention from the definition (z = Φ⁻¹(1 − δ) given).
KeptKeys vattention_row(const HeadView& view, int64_t i, int64_t sink, int64_t window, int64_t k, double base,
                        double eps, double z, const std::string& draw, RandomKey key) {
  const int64_t t = view.position(i);
  const auto seen = seen_keys(view, i);
  std::vector<double> e(seen.size());
  double top = -INFINITY;
  for (int64_t j : seen) top = std::max(top, logit(view, i, j));
  for (int64_t j : seen) e[j] = std::exp(logit(view, i, j) - top);
  std::vector<int64_t> fixed, rest;
  for (int64_t j : seen) (j < sink || (window > 0 && j > t - window) ? fixed : rest).push_back(j);
  KeptKeys kept;
  if (rest.size() < 2) {
    kept.keys = seen;
    kept.log_weights.assign(seen.size(), 0.0);
    return kept;
  }
  std::vector<int64_t> ranked = rest;
  std::stable_sort(ranked.begin(), ranked.end(), [&](int64_t a, int64_t b) { return e[a] > e[b]; });
  std::vector<char> in_top(seen.size(), 0);
  for (int64_t j : fixed) in_top[j] = 1;
  for (int64_t m = 0; m < std::min<int64_t>(k, static_cast<int64_t>(ranked.size())); ++m) in_top[ranked[m]] = 1;
  double top_mass = 0;
  for (int64_t j : seen) top_mass += in_top[j] ? e[j] : 0;
  std::vector<int64_t> range = rest;  // R_t, or U_t for wor
  if (draw == "wor") {
    range.clear();
    for (int64_t j : rest)
      if (!in_top[j]) range.push_back(j);
  }
  const int64_t r = static_cast<int64_t>(range.size());
  std::vector<double> w(seen.size(), 0.0);
  if (r > 0) {
    const RandomStream pilot_stream(key, Purpose::kPilotSample), stream(key, Purpose::kColumnSample);
    const int64_t b0 = std::max<int64_t>(2, static_cast<int64_t>(std::floor(base * r)));
    std::vector<int64_t> pilot(b0);
    double mean = 0, squares = 0, tail = 0;
    for (int64_t u = 0; u < b0; ++u) mean += e[pilot[u] = range[pilot_stream.index(r, t, u)]] / b0;
    for (int64_t j : pilot) squares += (e[j] - mean) * (e[j] - mean);
    std::sort(pilot.begin(), pilot.end());
    pilot.erase(std::unique(pilot.begin(), pilot.end()), pilot.end());
    for (int64_t j : pilot) tail += e[j];
    const double sigma = std::max(1e-8, std::sqrt(squares / (b0 - 1))), d_hat = top_mass + tail * r / b0;
    const double x = std::pow(z * sigma * r / std::max(eps * d_hat, 1e-8), 2);
    const int64_t b = std::min(r, std::max(b0, static_cast<int64_t>(std::floor(std::min(std::max(x, 1.0), 1.0 * r)))));
    if (draw == "wor") {
      std::vector<int64_t> order = range;  // the b largest uniforms at (t, key), ties to the older key
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) {
        return stream.uniform(t, static_cast<uint32_t>(a)) > stream.uniform(t, static_cast<uint32_t>(c));
      });
      for (int64_t m = 0; m < b; ++m) w[order[m]] = static_cast<double>(r) / b;
    } else {
      for (int64_t u = 0; u < b; ++u) {
        const int64_t j = range[stream.index(r, t, u)];
        if (!in_top[j]) w[j] = draw == "hh" ? w[j] + static_cast<double>(r) / b : static_cast<double>(r) / b;
      }
    }
  }
  for (int64_t j : seen)
    if (in_top[j] || w[j] > 0) {
      kept.keys.push_back(j);
      kept.log_weights.push_back(in_top[j] ? 0.0 : std::log(w[j]));
    }
  return kept;
}

// ô of a kept set in float64 (N̂/D̂), the estimate the float32 output must match.
MatrixD attend(const HeadView& view, const std::function<KeptKeys(int64_t)>& row) {
  MatrixD out(view.n(), view.pv());
  for (int64_t i = 0; i < view.n(); ++i) {
    const RowSums s = estimated_sums(view, i, row(i));
    out.row(i) = s.den > 0 ? RowVectorD(s.num / s.den) : RowVectorD::Zero(view.pv());
  }
  return out;
}

double relative(const MatrixD& a, const MatrixD& b) { return (a - b).norm() / b.norm(); }

void check_same_kept(const KeptKeys& got, const KeptKeys& want, double tolerance = 1e-12) {
  REQUIRE(got.keys == want.keys);
  REQUIRE(got.log_weights.size() == want.log_weights.size());
  for (size_t r = 0; r < got.keys.size(); ++r)
    CHECK(std::abs(got.log_weights[r] - want.log_weights[r]) <=
          tolerance * std::max(1.0, std::abs(want.log_weights[r])));
}

// Per-row means of D̂ and N̂ over `seeds` trials against D and N: the largest |z| over rows (D̂) and over entries
// (N̂), and the ratio's relative bias ‖mean ô − o‖_F/‖o‖_F with the largest |z| of its entries. Unbiasedness is
// checked as the largest |z| below 4 (issue 41's bound): with fixed seeds the test is deterministic, and under the
// null the chance that one of 512 entries passes 4 is 3%.
struct Unbiasedness {
  double max_z_den = 0, max_z_num = 0, ratio_bias = 0, max_z_ratio = 0;
};
Unbiasedness over_seeds(const std::string& spec, const HeadView& view, int seeds) {
  const int64_t n = view.n(), pv = view.pv();
  std::vector<double> den(n, 0), den2(n, 0);
  MatrixD num = MatrixD::Zero(n, pv), num2 = MatrixD::Zero(n, pv), ratio = MatrixD::Zero(n, pv),
          ratio2 = MatrixD::Zero(n, pv);
  const auto estimator = parse_spec(spec).make();
  for (int s = 0; s < seeds; ++s) {
    const auto rows = estimator->kept_keys(view, context(spec, static_cast<uint32_t>(s)));
    for (int64_t i = 0; i < n; ++i) {
      const RowSums e = estimated_sums(view, i, rows(i));
      den[i] += e.den, den2[i] += e.den * e.den;
      num.row(i) += e.num, num2.row(i) += e.num.cwiseProduct(e.num);
      const RowVectorD o_hat = e.den > 0 ? RowVectorD(e.num / e.den) : RowVectorD::Zero(pv);
      ratio.row(i) += o_hat, ratio2.row(i) += o_hat.cwiseProduct(o_hat);
    }
  }
  const double T = seeds;
  auto z = [&](double sum, double squares, double target) {
    const double mean = sum / T, var = std::max(0.0, squares / T - mean * mean) * T / (T - 1);
    const double se = std::sqrt(var / T);
    if (se <= 1e-13 * std::max(1.0, std::abs(target)))
      return std::abs(mean - target) <= 1e-10 * std::abs(target) ? 0.0 : 1e9;
    return std::abs(mean - target) / se;
  };
  Unbiasedness out;
  MatrixD exact(n, pv), bias(n, pv);
  for (int64_t i = 0; i < n; ++i) {
    const RowSums x = exact_sums(view, i);
    exact.row(i) = x.num / x.den;
    out.max_z_den = std::max(out.max_z_den, z(den[i], den2[i], x.den));
    for (int64_t c = 0; c < pv; ++c) {
      out.max_z_num = std::max(out.max_z_num, z(num(i, c), num2(i, c), x.num(c)));
      out.max_z_ratio = std::max(out.max_z_ratio, z(ratio(i, c), ratio2(i, c), exact(i, c)));
      bias(i, c) = ratio(i, c) / T - exact(i, c);
    }
  }
  out.ratio_bias = bias.norm() / exact.norm();
  return out;
}

}  // namespace

// ---- oracle_sample --------------------------------------------------------------------------------------------

TEST_CASE("oracle_sample: the definition's draws and weights and D-hat = D every trial", "[sampling]") {
  HeadView view = synth_slice(80, 16, 0.3, 5, 12);
  for (const Mask mask : {Mask::kCausal, Mask::kFull}) {
    view.mask = mask;
    const std::string spec = "oracle_sample(b=24)";
    for (uint32_t trial = 0; trial < 20; ++trial) {
      const EstimateContext ctx = context(spec, trial);
      const auto rows = parse_spec(spec).make()->kept_keys(view, ctx);
      double worst = 0;
      for (int64_t i = 0; i < view.n(); ++i) {
        const KeptKeys got = rows(i);
        check_same_kept(got, oracle_sample_row(view, i, 24, ctx.key), 1e-9);
        CHECK(got.scored == static_cast<double>(seen_keys(view, i).size()));
        worst = std::max(worst, std::abs(estimated_sums(view, i, got).den / exact_sums(view, i).den - 1));
      }
      CHECK(worst < 1e-12);  // observed ≤ 8.9e-16: w_j·e^{ℓ_j} = c_j·D/b
      MatrixF out;
      parse_spec(spec).make()->estimate(view, ctx, out);
      const MatrixD want = attend(view, [&](int64_t i) { return oracle_sample_row(view, i, 24, ctx.key); });
      CHECK(relative(out.cast<double>(), want) < 1e-5);  // float32 rounding: observed ~2e-7
    }
  }
}

TEST_CASE("oracle_sample: the mean of o-hat over 2000 seeds is o (no ratio bias)", "[sampling]") {
  HeadView view = synth_slice(40, 8, 0.5, 9, 8);
  view.mask = Mask::kCausal;
  const Unbiasedness u = over_seeds("oracle_sample(b=4)", view, 2000);
  INFO("max |z| of D-hat " << u.max_z_den << ", of the ratio " << u.max_z_ratio << ", bias " << u.ratio_bias);
  CHECK(u.max_z_den < 1e-3);   // D̂ = D up to rounding, whose spread makes a meaningless z: observed 7.7e-6
  CHECK(u.max_z_ratio < 4.0);  // observed 2.8 over 320 entries (relative bias 0.017, noise)
}

// ---- magicpig -------------------------------------------------------------------------------------------------

TEST_CASE("magicpig: the inclusion probability in its stable forms", "[sampling][magicpig]") {
  const int64_t L = 150;
  // Where both are accurate (p not small), the stable min=2 form equals the naive one.
  for (const double p : {0.01, 0.05, 0.2, 0.5, 0.9}) {
    const double naive = 1 - std::pow(1 - p, L - 1) * (1 + (L - 1) * p);
    CHECK(std::abs(magicpig_inclusion(p, L, 2) - naive) <= 1e-15);  // observed ≤ 1.1e-16
    CHECK(std::abs(magicpig_inclusion(p, L, 2) - binomial_tail(p, L, 2)) <= 1e-13 * naive);
    // min = 1: 1 − (1 − p)^L; min ≥ 3: the binomial tail.
    CHECK(std::abs(magicpig_inclusion(p, L, 1) - (1 - std::pow(1 - p, L))) <= 1e-15);
    for (const int64_t m : {3, 5, 40})
      CHECK(std::abs(magicpig_inclusion(p, L, m) - binomial_tail(p, L, m)) <=
            1e-12 * binomial_tail(p, L, m) + 1e-300);  // observed ≤ 3e-15 relative
  }
  // As p → 0, π → C(L,2)·p² (the next term is −2·C(L,3)·p³), where the naive form cancels.
  const double tiny = 1e-6, leading = L * (L - 1) / 2.0 * tiny * tiny;
  const double stable = magicpig_inclusion(tiny, L, 2);
  CHECK(std::abs(stable / binomial_tail(tiny, L, 2) - 1) < 1e-12);
  CHECK(std::abs(stable / leading - 1) < 150 * tiny);  // the next terms, ~(L − 2/3·(L − 2))·p: observed 9.9e-5
  const float naive32 = 1.0f - std::pow(1.0f - static_cast<float>(tiny), static_cast<float>(L - 1)) *
                                   (1.0f + static_cast<float>(L - 1) * static_cast<float>(tiny));
  CHECK(std::abs(naive32 - stable) > 100 * stable);  // float32: observed 1.97e-6 against 1.12e-8
  const double naive64 = 1 - std::pow(1 - tiny, L - 1) * (1 + (L - 1) * tiny);
  CHECK(std::abs(naive64 / stable - 1) > 1e-9);  // float64 loses digits: observed 3.9e-7 relative
  for (const double p : {1e-9, 1e-12, 1e-15})
    CHECK(std::abs(magicpig_inclusion(p, L, 2) / (L * (L - 1) / 2.0 * p * p) - 1) < 1e-6);
  CHECK(std::abs(magicpig_inclusion(1e-12, L, 3) / binomial_tail(1e-12, L, 3) - 1) < 1e-12);
  CHECK(magicpig_inclusion(0, L, 2) == 0);
  CHECK(magicpig_inclusion(1, L, 2) == 1);
  // The collision probability of K hyperplanes: (1 − θ/π)^K.
  CHECK(std::abs(simhash_collision(0.0, 2) - 0.25) < 1e-15);
  CHECK(simhash_collision(1.0, 10) == 1.0);
  CHECK(simhash_collision(-1.0, 10) == 0.0);
}

TEST_CASE("magicpig: inclusion frequencies over hash draws match pi_j", "[sampling][magicpig]") {
  // One query against 201 keys (p = 16, K = 4, L = 20, every key hashed under the full mask), 4000 draws of the
  // hyperplanes: each key's selection count against T·π_j (binomial z).
  const HeadView whole = synth_slice(201, 16, 1.0, 21, 16);
  HeadView view = decode_view(whole, 1);
  view.mask = Mask::kFull;
  const std::string spec = "magicpig(K=4,L=20,sink=0,window=0,min=2,floor=0,anchor=row)";
  const int draws = 4000;
  std::vector<int> count(view.keys(), 0);
  const auto estimator = parse_spec(spec).make();
  for (int d = 0; d < draws; ++d)
    for (int64_t j : estimator->kept_keys(view, context(spec, d))(0).keys) ++count[j];
  // π_j from the definition: the centre is the mean of all keys.
  RowVectorD centre = view.kf.cast<double>().colwise().mean();
  const RowVectorD q = view.qf.row(0).cast<double>();
  double max_z = 0;
  for (int64_t j = 0; j < view.keys(); ++j) {
    const RowVectorD x = view.kf.row(j).cast<double>() - centre;
    const double prob =
        std::pow(1 - std::acos(std::clamp(q.dot(x) / (q.norm() * x.norm()), -1.0, 1.0)) / std::numbers::pi, 4);
    const double pi = binomial_tail(prob, 20, 2);
    max_z = std::max(max_z, std::abs(count[j] - draws * pi) / std::sqrt(std::max(draws * pi * (1 - pi), 1.0)));
  }
  INFO("max |z| " << max_z);
  CHECK(max_z < 4.0);  // observed 3.6 over 201 keys
}

TEST_CASE("magicpig: kept keys and weights as defined under every anchor and mask", "[sampling][magicpig]") {
  const HeadView whole = [] {
    HeadView v = synth_slice(90, 8, 0.5, 13, 6);
    v.mask = Mask::kCausal;
    return v;
  }();
  struct Case {
    std::string spec;
    PigParams o;
    HeadView view;
  };
  HeadView full = whole;
  full.mask = Mask::kFull;
  const HeadView decode = decode_view(whole, 20);  // P = 70
  const std::vector<Case> cases = {
      {"magicpig(K=3,L=12,sink=2,window=9,min=2,floor=1e-4,anchor=row)", {3, 12, 2, 9, 2, 1e-4, false, true}, whole},
      {"magicpig(K=3,L=12,sink=2,window=9,min=1,floor=0,anchor=row,center=0)",
       {3, 12, 2, 9, 1, 0, false, false},
       whole},
      {"magicpig(K=3,L=12,sink=2,window=9,min=3,floor=0,anchor=prefill)", {3, 12, 2, 9, 3, 0, true, true}, decode},
      {"magicpig(K=3,L=12,sink=2,window=9,min=2,floor=1e-4)", {3, 12, 2, 9, 2, 1e-4, true, true}, decode},  // auto
      {"magicpig(K=3,L=12,sink=2,window=9)", {3, 12, 2, 9, 2, 1e-4, false, true}, whole},  // auto, P = 0: row
      {"magicpig(K=3,L=12,sink=2,window=9)", {3, 12, 2, 9, 2, 1e-4, false, true}, full},
      // anchor=row after a prompt, and L = 70 tables (two words of table bits in the row search).
      {"magicpig(K=3,L=12,sink=2,window=9,min=2,floor=1e-4,anchor=row)", {3, 12, 2, 9, 2, 1e-4, false, true}, decode},
      {"magicpig(K=2,L=70,sink=2,window=9,min=3,floor=0,anchor=row)", {2, 70, 2, 9, 3, 0, false, true}, whole},
  };
  for (const Case& c : cases) {
    INFO(c.spec << " mask " << mask_name(c.view.mask) << " rows " << c.view.n());
    for (uint32_t trial = 0; trial < 3; ++trial) {
      const EstimateContext ctx = context(c.spec, trial);
      const auto rows = parse_spec(c.spec).make()->kept_keys(c.view, ctx);
      // Rows in either order: anchor=row searches 32 rows together, the first time one of them is asked for.
      for (int64_t r = 0; r < c.view.n(); ++r) {
        const int64_t i = trial == 1 ? c.view.n() - 1 - r : r;
        check_same_kept(rows(i), magicpig_row(c.view, i, c.o, ctx.key), 1e-9);
      }
      MatrixF out;
      parse_spec(c.spec).make()->estimate(c.view, ctx, out);
      const MatrixD want = attend(c.view, [&](int64_t i) { return magicpig_row(c.view, i, c.o, ctx.key); });
      CHECK(relative(out.cast<double>(), want) < 1e-5);  // float32 rounding
    }
  }
}

TEST_CASE("magicpig: exact when sink + window cover the keys and prefill needs a prompt", "[sampling][magicpig]") {
  HeadView view = synth_slice(60, 8, 0.3, 4, 8);
  view.mask = Mask::kCausal;
  const MatrixD exact = attention_rows_f64(view.q, view.k, view.scale, 0, view.n(), view.geometry()) * view.v;
  for (const std::string spec : {"magicpig(sink=4,window=56,anchor=row)", "magicpig(sink=0,window=60)"}) {
    const MatrixD got = attend_kept_f64(view, parse_spec(spec).make()->kept_keys(view, context(spec, 0)));
    CHECK(relative(got, exact) < 1e-12);  // observed 2e-16
  }
  const auto prefill = parse_spec("magicpig(anchor=prefill)").make();
  CHECK_THROWS_AS(prefill->kept_keys(view, context("magicpig", 0)), UsageError);
  CHECK_THROWS_AS(parse_spec("magicpig(L=4,min=5)"), UsageError);
}

TEST_CASE("magicpig: tables=group shares the hyperplanes of a kv group and tables=head does not",
          "[sampling][magicpig]") {
  HeadView view = synth_slice(120, 8, 0.5, 6, 8);
  view.mask = Mask::kCausal;
  const RandomKey group = make_random_key(1, "kv", 0);
  for (const std::string tables : {"group", "head"}) {
    const std::string spec = "magicpig(K=4,L=16,sink=2,window=5,anchor=row,tables=" + tables + ")";
    MatrixF a, b;
    parse_spec(spec).make()->estimate(view, {make_random_key(1, "head=0", 0), nullptr, group}, a);
    parse_spec(spec).make()->estimate(view, {make_random_key(1, "head=1", 0), nullptr, group}, b);
    CHECK((a == b) == (tables == "group"));
  }
}

TEST_CASE("magicpig: decode rows read no later token (prefill and auto anchors)", "[sampling][magicpig][leak]") {
  HeadView whole = synth_slice(130, 8, 0.5, 17, 8);
  whole.mask = Mask::kCausal;
  for (const std::string spec :
       {"magicpig(K=4,L=24,sink=2,window=9,anchor=prefill)", "magicpig(K=4,L=24,sink=2,window=9)"})
    for (const int64_t from : {int64_t{101}, int64_t{115}, int64_t{129}}) {
      const HeadView a = decode_view(whole, 30), b = decode_view(with_tokens_replaced(whole, from, 3), 30);
      MatrixF out_a, out_b;
      parse_spec(spec).make()->estimate(a, context(spec, 2), out_a);
      parse_spec(spec).make()->estimate(b, context(spec, 2), out_b);
      INFO(spec << " tokens from " << from);
      CHECK(rows_identical(out_a, out_b, from - 100));  // rows at positions 100..from − 1
      CHECK(!rows_identical(out_a, out_b, 30));
    }
}

TEST_CASE("magicpig(floor=0): N-hat and D-hat unbiased over 2000 hash draws and the ratio biased",
          "[sampling][magicpig]") {
  HeadView view = synth_slice(48, 16, 0.5, 31, 8);
  view.mask = Mask::kCausal;
  const Unbiasedness few = over_seeds("magicpig(K=4,L=8,sink=2,window=5,floor=0,anchor=row)", view, 2000);
  const Unbiasedness many = over_seeds("magicpig(K=4,L=40,sink=2,window=5,floor=0,anchor=row)", view, 2000);
  INFO("L=8: z(D) " << few.max_z_den << " z(N) " << few.max_z_num << " ratio bias " << few.ratio_bias << " z "
                    << few.max_z_ratio);
  INFO("L=40: z(D) " << many.max_z_den << " z(N) " << many.max_z_num << " ratio bias " << many.ratio_bias << " z "
                     << many.max_z_ratio);
  CHECK(few.max_z_den < 4.0);                     // observed 2.1 (48 rows)
  CHECK(few.max_z_num < 4.0);                     // observed 3.0 (384 entries)
  CHECK(many.max_z_den < 4.0);                    // observed 3.3
  CHECK(many.max_z_num < 4.0);                    // observed 2.9
  CHECK(few.max_z_ratio > 4.5);                   // the ratio's bias is visible: observed z 38 (L = 8)
  CHECK(many.ratio_bias < 0.5 * few.ratio_bias);  // and shrinks with the budget: observed 0.0094 (L = 40), 0.116
}

TEST_CASE("magicpig(floor>0): E[D-hat] = the exact part + the hashed keys' e^l pi/(pi + floor)",
          "[sampling][magicpig]") {
  // A large floor (0.05) makes the bias of the reference's floor visible over 2000 draws.
  HeadView view = synth_slice(40, 16, 0.5, 41, 8);
  view.mask = Mask::kCausal;
  const std::string spec = "magicpig(K=4,L=8,sink=2,window=5,floor=0.05,anchor=row)";
  const int seeds = 2000;
  std::vector<double> sum(view.n(), 0), squares(view.n(), 0);
  const auto estimator = parse_spec(spec).make();
  for (int s = 0; s < seeds; ++s) {
    const auto rows = estimator->kept_keys(view, context(spec, static_cast<uint32_t>(s)));
    for (int64_t i = 0; i < view.n(); ++i) {
      const double d = estimated_sums(view, i, rows(i)).den;
      sum[i] += d, squares[i] += d * d;
    }
  }
  double max_z_formula = 0, max_z_exact = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    const int64_t t = view.position(i), he = std::max<int64_t>(2, t - 5 + 1);
    double top = -INFINITY;
    for (int64_t j = 0; j <= t; ++j) top = std::max(top, logit(view, i, j));
    RowVectorD centre = RowVectorD::Zero(view.p());
    for (int64_t j = 2; j < he; ++j) centre += view.kf.row(j).cast<double>() / static_cast<double>(he - 2);
    const RowVectorD q = view.qf.row(i).cast<double>();
    double expected = 0;
    for (int64_t j = 0; j <= t; ++j) {
      const double e = std::exp(logit(view, i, j) - top);
      if (j < 2 || j >= he) {
        expected += e;
        continue;
      }
      const RowVectorD x = view.kf.row(j).cast<double>() - centre;
      const double norms = q.norm() * x.norm();
      const double prob =
          std::pow(1 - std::acos(std::clamp(norms > 0 ? q.dot(x) / norms : 0.0, -1.0, 1.0)) / std::numbers::pi, 4);
      const double pi = binomial_tail(prob, 8, 2);
      expected += e * pi / (pi + 0.05);
    }
    const double mean = sum[i] / seeds, se = std::sqrt(std::max(0.0, squares[i] / seeds - mean * mean) / (seeds - 1));
    if (se == 0) continue;  // rows with no hashed key: exact
    max_z_formula = std::max(max_z_formula, std::abs(mean - expected) / se);
    max_z_exact = std::max(max_z_exact, std::abs(mean - exact_sums(view, i).den) / se);
  }
  INFO("max |z| against the formula " << max_z_formula << ", against D " << max_z_exact);
  CHECK(max_z_formula < 4.0);  // observed 2.2 (40 rows)
  CHECK(max_z_exact > 4.5);    // the floor's bias: observed 45
}

// ---- vattention -----------------------------------------------------------------------------------------------

TEST_CASE("vattention: the CLT budget and its two clamps", "[sampling][vattention]") {
  CHECK(std::abs(normal_quantile(0.75) - 0.6744897501960817) < 1e-14);
  CHECK(std::abs(normal_quantile(0.975) - 1.959963984540054) < 1e-14);
  CHECK(std::abs(normal_quantile(0.01) + 2.3263478740408408) < 1e-13);
  CHECK(std::abs(normal_quantile(1e-10) + 6.361340902404056) < 1e-11);
  const double z = 0.6744897501960817;  // δ = 0.25
  // x = (z·σ·r/(ε·D))² in the middle: σ = 0.5, D = 40, r = 1000, ε = 0.25 → x = (z·0.5·1000/10)² = 1137.3…
  // clamped by r = 1000 (the upper clamp).
  CHECK(vattention_budget(0.5, 40, 1000, 0.25, 0.25, 50) == 1000);
  // σ = 0.1: x = (z·100/10)² = 45.49 → 45, below b₀ = 50 (the lower clamp).
  CHECK(vattention_budget(0.1, 40, 1000, 0.25, 0.25, 50) == 50);
  // σ = 0.3: x = (z·300/10)² = 409.45 → 409, inside both clamps.
  CHECK(vattention_budget(0.3, 40, 1000, 0.25, 0.25, 50) == static_cast<int64_t>(std::floor(std::pow(z * 30, 2))));
  CHECK(vattention_budget(0.3, 40, 1000, 0.25, 0.25, 50) == 409);
  // ε·D below 1e-8 is taken as 1e-8; x < 1 is taken as 1 (b ≥ b₀ ≥ 2 anyway).
  CHECK(vattention_budget(1e-8, 0, 10, 0.25, 0.25, 2) == 10);
  CHECK(vattention_budget(1e-8, 100, 10, 0.25, 0.25, 2) == 2);
}

TEST_CASE("vattention: kept keys and weights as defined for each draw", "[sampling][vattention]") {
  HeadView causal = synth_slice(150, 8, 0.4, 19, 6);
  causal.mask = Mask::kCausal;
  HeadView full = causal;
  full.mask = Mask::kFull;
  const double z = 1.2815515655446004;  // δ = 0.1
  for (const std::string draw : {"hh", "ref", "wor"})
    for (const HeadView* view : {&causal, &full}) {
      const std::string spec = "vattention(sink=3,window=10,k=8,base=0.1,eps=0.2,delta=0.1,draw=" + draw + ")";
      INFO(spec << " " << mask_name(view->mask));
      const int64_t sink = view->mask == Mask::kFull ? 0 : 3, window = view->mask == Mask::kFull ? 0 : 10;
      for (uint32_t trial = 0; trial < 3; ++trial) {
        const EstimateContext ctx = context(spec, trial);
        const auto rows = parse_spec(spec).make()->kept_keys(*view, ctx);
        auto want = [&](int64_t i) { return vattention_row(*view, i, sink, window, 8, 0.1, 0.2, z, draw, ctx.key); };
        for (int64_t i = 0; i < view->n(); ++i) check_same_kept(rows(i), want(i));
        MatrixF out;
        parse_spec(spec).make()->estimate(*view, ctx, out);
        CHECK(relative(out.cast<double>(), attend(*view, want)) < 1e-5);
      }
    }
}

TEST_CASE("vattention: exact limits (window covers the row and wor with b' = n_u)", "[sampling][vattention]") {
  HeadView view = synth_slice(70, 8, 0.3, 23, 8);
  view.mask = Mask::kCausal;
  const MatrixD exact = attention_rows_f64(view.q, view.k, view.scale, 0, view.n(), view.geometry()) * view.v;
  // window ≥ t + 1: r < 2 on every row; eps tiny: b = n_u, every key outside T_t drawn once with weight 1.
  for (const std::string spec : {"vattention(window=70)", "vattention(sink=2,window=4,k=4,eps=1e-9,draw=wor)"}) {
    const MatrixD got = attend_kept_f64(view, parse_spec(spec).make()->kept_keys(view, context(spec, 0)));
    CHECK(relative(got, exact) < 1e-12);  // observed 2e-16
  }
}

TEST_CASE("vattention(draw=hh): N-hat and D-hat unbiased over 2000 seeds and the ratio biased",
          "[sampling][vattention]") {
  HeadView view = synth_slice(64, 8, 0.5, 29, 8);
  view.mask = Mask::kCausal;
  // eps = 2 keeps the CLT budget below the pilot's b₀, so `base` sets the budget: b = max(2, ⌊base·r⌋).
  const Unbiasedness few = over_seeds("vattention(sink=2,window=4,k=2,base=0.02,eps=2)", view, 2000);
  const Unbiasedness many = over_seeds("vattention(sink=2,window=4,k=2,base=0.5,eps=2)", view, 2000);
  INFO("base=0.02: z(D) " << few.max_z_den << " z(N) " << few.max_z_num << " ratio bias " << few.ratio_bias << " z "
                          << few.max_z_ratio);
  INFO("base=0.5: z(D) " << many.max_z_den << " z(N) " << many.max_z_num << " ratio bias " << many.ratio_bias << " z "
                         << many.max_z_ratio);
  CHECK(few.max_z_den < 4.0);                     // observed 2.6 (64 rows)
  CHECK(few.max_z_num < 4.0);                     // observed 2.9 (512 entries)
  CHECK(many.max_z_den < 4.0);                    // observed 2.8
  CHECK(many.max_z_num < 4.0);                    // observed 2.9
  CHECK(few.max_z_ratio > 4.5);                   // the ratio's bias is visible: observed z 20 (base = 0.02)
  CHECK(many.ratio_bias < 0.5 * few.ratio_bias);  // and shrinks with the budget: observed 0.021 (base = 0.5), 0.150
}

TEST_CASE("vattention(draw=ref): repeats collapse, so the sampled tail of D-hat is c(b, r) times the true one",
          "[sampling][vattention]") {
  // The hub's code draws b keys of the r in R_t uniformly with replacement and gives each distinct one outside T_t the
  // weight r/b: E[weight] = (r/b)·P(drawn) = (r/b)(1 − (1 − 1/r)^b) = c(b, r) (0.63 at b = r), not 1. eps = 2 keeps
  // the budget at b = max(2, ⌊base·r⌋), the same every trial; base = 0.3 keeps r/b ≥ 3, so a sampled key's
  // log-weight log(r/b) is never 0 and the tail (the keys with a non-zero log-weight) is read off each trial.
  HeadView view = synth_slice(64, 8, 0.5, 29, 8);
  view.mask = Mask::kCausal;
  const std::string spec = "vattention(sink=2,window=4,k=2,base=0.3,eps=2,draw=ref)";
  const auto estimator = parse_spec(spec).make();
  const int seeds = 2000;
  const int64_t n = view.n();
  std::vector<double> sum(n, 0), squares(n, 0), ratio(n, 0);  // the sampled tail's share of D, per row
  for (int s = 0; s < seeds; ++s) {
    const auto rows = estimator->kept_keys(view, context(spec, static_cast<uint32_t>(s)));
    for (int64_t i = 0; i < n; ++i) {
      const KeptKeys kept = rows(i);
      const double d = exact_sums(view, i).den;
      KeptKeys tail;
      for (size_t r = 0; r < kept.keys.size(); ++r)
        if (kept.log_weights[r] != 0) {
          tail.keys.push_back(kept.keys[r]);
          tail.log_weights.push_back(kept.log_weights[r]);
          ratio[i] = std::exp(kept.log_weights[r]);  // r/b
        }
      const double share = estimated_sums(view, i, tail).den / d;
      sum[i] += share, squares[i] += share * share;
    }
  }
  // The true tail U_t = R_t minus the oracle top 2, from the definitions: R_t = [2, t − 3), the top 2 of it by logit.
  double max_z = 0, hh_like = 0;
  int rows_checked = 0;
  for (int64_t t = 8; t < n; ++t) {
    std::vector<int64_t> rest;
    for (int64_t j = 2; j < t - 3; ++j) rest.push_back(j);
    std::vector<int64_t> by_logit = rest;
    std::stable_sort(by_logit.begin(), by_logit.end(),
                     [&](int64_t x, int64_t y) { return logit(view, t, x) > logit(view, t, y); });
    const RowSums all = exact_sums(view, t);
    double top = -INFINITY;
    for (int64_t j : seen_keys(view, t)) top = std::max(top, logit(view, t, j));
    double true_tail = 0;
    for (size_t u = 2; u < by_logit.size(); ++u) true_tail += std::exp(logit(view, t, by_logit[u]) - top) / all.den;
    const double r = static_cast<double>(rest.size()), b = std::round(r / ratio[t]);
    REQUIRE(b == std::max(2.0, std::floor(0.3 * r)));
    const double c = (r / b) * (1 - std::pow(1 - 1 / r, b));
    const double mean = sum[t] / seeds, var = (squares[t] / seeds - mean * mean) * seeds / (seeds - 1);
    max_z = std::max(max_z, std::abs(mean - c * true_tail) / std::sqrt(var / seeds));
    hh_like = std::max(hh_like, std::abs(mean - true_tail) / std::sqrt(var / seeds));
    ++rows_checked;
  }
  INFO("max |z| against c(b, r)·tail: " << max_z << ", against the tail itself: " << hh_like);
  CHECK(rows_checked == 56);
  CHECK(max_z < 4.0);    // observed 2.26 over 56 rows
  CHECK(hh_like > 4.5);  // the bias is visible: observed 33
}

// ---- the sampling metrics -------------------------------------------------------------------------------------

TEST_CASE("sampling metrics: den_rel num_rel eps_cover pilot and the tail metrics for deterministic selections only",
          "[sampling]") {
  HeadView view = synth_slice(100, 8, 0.4, 37, 8);
  view.mask = Mask::kCausal;
  const std::vector<Metric> which = {Metric::kDenRel, Metric::kNumRel, Metric::kEpsCover, Metric::kPilot,
                                     Metric::kTailMass};
  const MatrixD exact = attention_rows_f64(view.q, view.k, view.scale, 0, view.n(), view.geometry()) * view.v;
  // The definitions, from the kept keys (float64 data of the view, as the metrics use).
  auto expected = [&](const Estimator::KeptRows& rows, double eps) {
    double den = 0, num = 0, covered = 0;
    for (int64_t i = 0; i < view.n(); ++i) {
      const KeptKeys kept = rows(i);
      const MatrixD a = attention_rows_f64(view.q, view.k, view.scale, i, 1, view.geometry());
      double d = 0;
      RowVectorD nn = RowVectorD::Zero(view.pv());
      for (size_t r = 0; r < kept.keys.size(); ++r) {
        d += a(0, kept.keys[r]) * std::exp(kept.log_weights[r]);
        nn += a(0, kept.keys[r]) * std::exp(kept.log_weights[r]) * view.v.row(kept.keys[r]);
      }
      den += std::abs(d - 1) / view.n();
      num += (nn - exact.row(i)).norm() / exact.row(i).norm() / view.n();
      covered += ((nn / d - exact.row(i)).norm() <= eps * exact.row(i).norm()) / static_cast<double>(view.n());
    }
    return std::vector<double>{den, num, covered};
  };
  const std::string oracle = "oracle_sample(b=16)";
  const auto oracle_rows = parse_spec(oracle).make()->kept_keys(view, context(oracle, 0));
  for (const double eps : {0.05, 0.3}) {
    const std::vector<double> got = selection_metrics(view, oracle_rows, which, eps);
    const std::vector<double> want = expected(oracle_rows, eps);
    CHECK(got[0] < 1e-6);  // D̂ = D up to rounding: observed 1.4e-16 (float32 dump data: widening is exact)
    CHECK(std::abs(got[0] - want[0]) < 1e-12);
    CHECK(std::abs(got[1] - want[1]) < 1e-12 * want[1]);
    CHECK(std::abs(got[2] - want[2]) < 1e-12);
    CHECK(std::isnan(got[3]));  // no pilot
    CHECK(std::isnan(got[4]));  // tail_mass: deterministic selections only
  }
  CHECK(selection_metrics(view, oracle_rows, which, 1e9)[2] == 1.0);
  // vattention: its own eps wins over --eps; pilot is the mean b₀ = max(2, ⌊base·r⌋).
  const std::string v = "vattention(sink=2,window=8,k=4,base=0.1,eps=0.3)";
  const auto v_rows = parse_spec(v).make()->kept_keys(view, context(v, 0));
  const std::vector<double> got = selection_metrics(view, v_rows, which, 1e9);
  CHECK(std::abs(got[2] - expected(v_rows, 0.3)[2]) < 1e-12);
  CHECK(got[2] < 1.0);
  double pilot = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    const int64_t r = std::max<int64_t>(0, view.position(i) - 8 + 1 - 2);
    pilot += (r < 2 ? 0.0 : std::max<double>(2, std::floor(0.1 * r))) / view.n();
  }
  CHECK(std::abs(got[3] - pilot) < 1e-12);
  // A deterministic selection: the sampling metrics are NaN, the tail ones numbers.
  const auto topk_rows = parse_spec("topk(k=8)").make()->kept_keys(view, context("topk", 0));
  const std::vector<double> det = selection_metrics(view, topk_rows, which, 0.05);
  for (int m = 0; m < 4; ++m) CHECK(std::isnan(det[m]));
  CHECK(det[4] > 0);
}

TEST_CASE("sampling metrics: --eps reaches eps_cover and run.json and bad values are usage errors", "[sampling][cli]") {
  const std::string dump = write_synth("sampling_eps.h5", synth_options(1, 2, 1, 64, 8));
  const std::string out = temp_path("sampling_eps.csv");
  CommandResult r =
      run_attnprobe(fmt::format("sweep {} -e 'oracle_sample(b=8)' -e 'vattention(eps=0.5)' --trials 2 "
                                "--mask causal --metrics fro_rel,eps_cover,den_rel,pilot --eps 0.2 -q -o {}",
                                dump, out));
  REQUIRE(r.exit_code == 0);
  const std::string info = read_text(out + ".run.json");
  CHECK(info.find("\"eps\": 0.2") != std::string::npos);
  CHECK(run_attnprobe(fmt::format("eval {} -e oracle_sample --metrics eps_cover --eps 0", dump)).exit_code == 2);
  CHECK(run_attnprobe(fmt::format("eval {} -e oracle_sample --metrics eps_cover --eps nan", dump)).exit_code == 2);
}
