#include "attnprobe/estimators/sampling/vattention/vattention.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {

double normal_quantile(double prob) {
  if (!(prob > 0 && prob < 1)) throw std::invalid_argument("normal_quantile: the probability must be in (0, 1)");
  // Acklam's rational approximations (relative error 1.15e-9), central part and the two tails.
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01, -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  auto tail = [&](double q) {
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  };
  double x;
  if (prob < kLow) {
    x = tail(std::sqrt(-2 * std::log(prob)));
  } else if (prob > 1 - kLow) {
    x = -tail(std::sqrt(-2 * std::log1p(-prob)));
  } else {
    const double q = prob - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  // Halley steps on Φ(x) − prob = ½·erfc(−x/√2) − prob, Φ' = e^{−x²/2}/√(2π).
  for (int step = 0; step < 2; ++step) {
    const double error = 0.5 * std::erfc(-x / std::numbers::sqrt2) - prob;
    const double u = error * std::sqrt(2 * std::numbers::pi) * std::exp(0.5 * x * x);
    x -= u / (1 + 0.5 * x * u);
  }
  return x;
}

int64_t vattention_budget(double sigma, double d_hat, int64_t r, double eps, double delta, int64_t b0) {
  const double z = normal_quantile(1 - delta);
  const double ratio = z * sigma * static_cast<double>(r) / std::max(eps * d_hat, 1e-8);
  const double x = std::min(std::max(ratio * ratio, 1.0), static_cast<double>(r));
  return std::min(r, std::max(b0, static_cast<int64_t>(std::floor(x))));
}

namespace {

// One row's pilot over the candidate keys `range` (absolute indices; e indexed from `first`): σ̂ and the tail part
// of D̂ (range.size()/b₀ times the distinct pilot keys' e).
struct Pilot {
  int64_t draws = 0;
  double sigma = 0, tail = 0;
};
Pilot pilot_of(const std::vector<int64_t>& range, const std::vector<double>& e, int64_t first, double base,
               const RandomStream& stream, uint32_t position) {
  const int64_t r = static_cast<int64_t>(range.size());
  Pilot pilot;
  pilot.draws = std::max<int64_t>(2, static_cast<int64_t>(std::floor(base * static_cast<double>(r))));
  std::vector<int64_t> keys(pilot.draws);
  double mean = 0;
  for (int64_t u = 0; u < pilot.draws; ++u) {
    keys[u] = range[stream.index(static_cast<uint32_t>(r), position, static_cast<uint32_t>(u))];
    mean += e[keys[u] - first];
  }
  mean /= static_cast<double>(pilot.draws);
  double squares = 0;
  for (int64_t j : keys) squares += (e[j - first] - mean) * (e[j - first] - mean);
  pilot.sigma = std::max(1e-8, std::sqrt(squares / static_cast<double>(pilot.draws - 1)));
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  for (int64_t j : keys) pilot.tail += e[j - first];
  pilot.tail *= static_cast<double>(r) / static_cast<double>(pilot.draws);
  return pilot;
}

class Vattention final : public KeptKeysEstimator {
 public:
  explicit Vattention(VattentionParams params) : o_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    return [&view, o = o_, precision = ctx.precision, pilot_stream = RandomStream(ctx.key, Purpose::kPilotSample),
            sample_stream = RandomStream(ctx.key, Purpose::kColumnSample)](int64_t i) {
      const bool full = view.mask == Mask::kFull;  // no positions: sink = window = 0
      const KeyRange seen = view.visible(i);
      const uint32_t position = static_cast<uint32_t>(view.position(i));
      std::vector<int64_t> rest;  // R_t
      KeptKeys kept = oracle_fixed_part(view, i, full ? 0 : o.sink, full ? 0 : o.window, rest);
      kept.eps = o.eps;
      const int64_t r = static_cast<int64_t>(rest.size());
      if (r < 2) {  // exact, as the hub's should_return_full_mask
        kept.keys.insert(kept.keys.end(), rest.begin(), rest.end());
        finish_kept(kept.keys);
        kept.log_weights.assign(kept.keys.size(), 0.0);
        kept.pilot = 0;
        return kept;
      }
      const std::vector<double> logits = score_visible(view, i);
      const double top = *std::max_element(logits.begin(), logits.end());
      std::vector<double> e(logits.size());
      for (size_t j = 0; j < e.size(); ++j) e[j] = std::exp(logits[j] - top);
      const std::vector<int64_t> best = best_by_score(rest, logits, seen.begin, o.k, precision, &kept.ties);
      kept.keys.insert(kept.keys.end(), best.begin(), best.end());
      finish_kept(kept.keys);  // T_t
      std::vector<char> in_top(e.size(), 0);
      double top_mass = 0;
      for (int64_t j : kept.keys) in_top[j - seen.begin] = 1, top_mass += e[j - seen.begin];
      std::vector<double> weights(e.size(), 0.0);  // w_j of the sampled keys outside T_t
      if (o.draw == VattentionDraw::kWor) {
        std::vector<int64_t> outside;  // U_t
        for (int64_t j : rest)
          if (!in_top[j - seen.begin]) outside.push_back(j);
        const int64_t n_u = static_cast<int64_t>(outside.size());
        kept.pilot = 0;
        if (n_u > 0) {
          const Pilot pilot = pilot_of(outside, e, seen.begin, o.base, pilot_stream, position);
          kept.pilot = static_cast<double>(pilot.draws);
          const int64_t b =
              std::min(n_u, vattention_budget(pilot.sigma, top_mass + pilot.tail, n_u, o.eps, o.delta, pilot.draws));
          std::vector<double> u(e.size(), 0.0);  // the uniform of key j at (t, j): the b largest win
          for (int64_t j : outside) u[j - seen.begin] = sample_stream.uniform(position, static_cast<uint32_t>(j));
          for (int64_t j : best_by_score(outside, u, seen.begin, b))
            weights[j - seen.begin] = static_cast<double>(n_u) / static_cast<double>(b);
        }
      } else {
        const Pilot pilot = pilot_of(rest, e, seen.begin, o.base, pilot_stream, position);
        kept.pilot = static_cast<double>(pilot.draws);
        const int64_t b = vattention_budget(pilot.sigma, top_mass + pilot.tail, r, o.eps, o.delta, pilot.draws);
        const double each = static_cast<double>(r) / static_cast<double>(b);
        for (int64_t u = 0; u < b; ++u) {
          const int64_t j = rest[sample_stream.index(static_cast<uint32_t>(r), position, static_cast<uint32_t>(u))];
          if (in_top[j - seen.begin]) continue;  // T_t is exact already
          double& w = weights[j - seen.begin];
          w = o.draw == VattentionDraw::kHh ? w + each : each;  // ref: repeats collapse
        }
      }
      kept.scored += kept.pilot;
      // T_t (log-weight 0) and the sampled keys outside it, in one ascending walk of the visible keys.
      kept.keys.clear();
      for (size_t j = 0; j < e.size(); ++j)
        if (in_top[j] || weights[j] > 0) {
          kept.keys.push_back(seen.begin + static_cast<int64_t>(j));
          kept.log_weights.push_back(in_top[j] ? 0.0 : std::log(weights[j]));
        }
      return kept;
    };
  }
  // The scores of every visible key, then T_t and the sample's logits and values (budgets vary: k + window as
  // a guide, plus ~10% of the rest).
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double rows = static_cast<double>(n);
    const double kept = static_cast<double>(std::min(n, o_.k + o_.sink + o_.window)) + 0.1 * rows;
    return 2.0 * rows * (rows * p + kept * (p + pv));
  }
  // The row's scores, exponentials, weights and marks (float64, per thread) besides the default temporaries.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    return Estimator::memory_bytes(n, p, pv) + 5.0 * 8.0 * static_cast<double>(n);
  }

 private:
  VattentionParams o_;
};

// Only the top-k part ranks; the budget, the samples and their weights come from the float64 logits.
constexpr const char* kVattentionRounding =
    "inputs and output in the precision; the logits that rank its top-k part stored in it (ties keep the older key); "
    "the pilot, the budget and the Horvitz-Thompson weights from the float64 logits; " ATTNPROBE_KEPT_KEYS_ATTENDED;

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<VattentionParams>{
    .name = "vattention",
    .family = "sampling",
    .summary = "vAttention: oracle top-k plus uniform samples of the rest, their number from a pilot's CLT bound",
    .page = "estimators/sampling_decode.md",
    .params = ParamSet<VattentionParams>()
                  .integer("sink", &VattentionParams::sink, 0, int64_t{1} << 30, "the first keys, exact (causal mask)")
                  .integer("window", &VattentionParams::window, 0, int64_t{1} << 30,
                           "the last keys up to the query's own, exact (causal mask)")
                  .integer("k", &VattentionParams::k, 0, int64_t{1} << 30, "oracle top-k beyond sink and window")
                  .real("base", &VattentionParams::base, 1e-9, 1, "the pilot's fraction of the sampled range")
                  .real("eps", &VattentionParams::eps, 1e-9, 1e6, "the relative error the budget aims at")
                  .real("delta", &VattentionParams::delta, 1e-9, 0.999999, "the probability it may exceed it")
                  .choice("draw", &VattentionParams::draw,
                          {{"hh", VattentionDraw::kHh}, {"ref", VattentionDraw::kRef}, {"wor", VattentionDraw::kWor}},
                          "hh: iid draws, repeats add (unbiased); ref: repeats collapse (the hub's code); "
                          "wor: without replacement outside the top-k (the paper)"),
    .capabilities = {.random = true,
                     .forms = kFullAndCausal,
                     .decode = kFullAndCausal,
                     .weights = kFullAndCausal,
                     .selection = true,
                     .rounding = kVattentionRounding},
    .ablations = {"vattention(sink=2,window=8,k=8,base=0.1,eps=0.1,delta=0.1)"},
    .make = [](const VattentionParams& params) { return std::make_unique<Vattention>(params); },
});

}  // namespace
}  // namespace attnprobe
