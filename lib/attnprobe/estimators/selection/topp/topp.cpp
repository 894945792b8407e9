#include "attnprobe/estimators/selection/topp/topp.h"

#include <algorithm>
#include <cmath>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

class Topp final : public KeptKeysEstimator {
 public:
  explicit Topp(ToppParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    return [&view, params = params_, precision = ctx.precision](int64_t i) {
      const KeyRange seen = view.visible(i);
      std::vector<int64_t> rest;  // R_t
      KeptKeys kept = oracle_fixed_part(view, i, params.sink, params.window, rest);
      if (params.p >= 1.0 || rest.empty()) {
        kept.keys.insert(kept.keys.end(), rest.begin(), rest.end());
      } else {
        kept_by_mass(stored_scores(score_visible(view, i), precision), seen.begin, params, rest, kept, precision);
      }
      finish_kept(kept.keys);
      return kept;
    };
  }
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * n * static_cast<double>(n) * (p + params_.p * (p + pv));
  }

 private:
  // Appends to kept.keys the keys of `rest` (R_t) that reach the mass p, ordered by (mass desc, index asc), and to
  // kept.ties the ranking's ties when the scores are stored below float32 (their masses are then those scores').
  static void kept_by_mass(const std::vector<double>& scores, int64_t first, const ToppParams& params,
                           std::vector<int64_t> rest, KeptKeys& kept, Precision precision) {
    std::sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) {
      const double sa = scores[a - first], sb = scores[b - first];
      return sa > sb || (sa == sb && a < b);
    });
    // Masses over the residual, from the largest logit down (ã_j = e^{ℓ_j − top} / Σ).
    const double top = scores[rest.front() - first];
    std::vector<double> mass(rest.size());
    double total = 0;
    for (size_t r = 0; r < rest.size(); ++r) total += mass[r] = std::exp(scores[rest[r] - first] - top);
    // The shortest prefix that reaches p (p = 0: none; strict: the shortest one above p).
    double cumulative = 0;
    size_t count = 0;
    const auto reached = [&] { return params.strict ? cumulative > params.p : cumulative >= params.p; };
    while (count < rest.size() && !reached()) cumulative += mass[count++] / total;
    if (params.strict && count > 0)  // the hub keeps every key whose mass reaches the last kept one's (ties join)
      while (count < rest.size() && mass[count] >= mass[count - 1]) ++count;
    if (below_float32(precision)) kept.ties += ranking_ties(rest, scores, first, static_cast<int64_t>(count));
    kept.keys.insert(kept.keys.end(), rest.begin(), rest.begin() + static_cast<int64_t>(count));
  }

  ToppParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<ToppParams>{
    .name = "topp",
    .family = "selection",
    .summary = "oracle top-p: each row attends its highest-weight keys until they hold mass p (plus sink and window)",
    .page = "estimators/selection.md",
    .params = ParamSet<ToppParams>()
                  .real("p", &ToppParams::p, 0.0, 1.0, "the attention mass kept, of the keys outside sink and window")
                  .integer("sink", &ToppParams::sink, 0, int64_t{1} << 30, "the first keys, always kept")
                  .integer("window", &ToppParams::window, 0, int64_t{1} << 30,
                           "the last keys up to the query's own, always kept")
                  .integer("strict", &ToppParams::strict, 0, 1,
                           "1: the sparse-attention hub's rule (mass above p; keys tied with the last one join)"),
    .capabilities = kOracleSelection,
    .narrow = [](const ToppParams& params, Capabilities& can) { positional_forms(params.sink, params.window, can); },
    .ablations = {"topp(p=0.5)", "topp(p=0.9,sink=4,window=16)"},
    .make = [](const ToppParams& params) { return std::make_unique<Topp>(params); },
});

}  // namespace
}  // namespace attnprobe
