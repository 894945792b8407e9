#include "attnprobe/estimators/sampling/oracle_sample/oracle_sample.h"

#include <algorithm>
#include <cmath>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

class OracleSample final : public KeptKeysEstimator {
 public:
  explicit OracleSample(OracleSampleParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    return [&view, b = params_.b, stream = RandomStream(ctx.key, Purpose::kColumnSample)](int64_t i) {
      const KeyRange seen = view.visible(i);
      const std::vector<double> logits = score_visible(view, i);
      const double top = *std::max_element(logits.begin(), logits.end());
      std::vector<double> e(logits.size());
      double total = 0;
      for (size_t j = 0; j < e.size(); ++j) total += e[j] = std::exp(logits[j] - top);
      // Draw u of the row at absolute position t: the uniform at (t, u), whatever rows are evaluated together.
      const std::vector<int64_t> draws = sample_with_replacement(e, b, stream, static_cast<uint32_t>(view.position(i)));
      std::vector<int64_t> count(e.size(), 0);
      for (int64_t j : draws) ++count[j];
      KeptKeys kept{{}, {}, static_cast<double>(seen.size())};  // an oracle scores every key it sees
      // ω_j = log(c_j / b) − log a_j, log a_j = (ℓ_j − top) − log Σ e.
      const double log_total = std::log(total), log_b = std::log(static_cast<double>(b));
      for (size_t j = 0; j < e.size(); ++j) {
        if (count[j] == 0) continue;
        kept.keys.push_back(seen.begin + static_cast<int64_t>(j));
        kept.log_weights.push_back(std::log(static_cast<double>(count[j])) - log_b - (logits[j] - top) + log_total);
      }
      return kept;
    };
  }
  // The scores of every visible key, the draws' binary searches, then the sampled keys' logits and values.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.b));
    return 2.0 * n * (static_cast<double>(n) * p + kept * (p + pv));
  }
  // The row's scores, exponentials and multiplicities (float64, per thread) besides the default temporaries.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    return Estimator::memory_bytes(n, p, pv) + 3.0 * 8.0 * static_cast<double>(n);
  }

 private:
  OracleSampleParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<OracleSampleParams>{
    .name = "oracle_sample",
    .family = "sampling",
    .summary = "oracle sampling: b draws per row from the exact attention weights, Hansen-Hurwitz weights (D exact)",
    .page = "estimators/sampling_decode.md",
    .params = ParamSet<OracleSampleParams>().integer("b", &OracleSampleParams::b, 1, int64_t{1} << 30,
                                                     "draws per row from the exact weights, with replacement"),
    .samples_knob = "b",
    .capabilities = {.random = true,
                     .forms = kAllMasks,
                     .decode = kAllMasks,
                     .weights = kAllMasks,
                     .selection = true,
                     .rounding = kKeptKeysRounded},
    .ablations = {"oracle_sample(b=16)"},
    .make = [](const OracleSampleParams& params) { return std::make_unique<OracleSample>(params); },
});

}  // namespace
}  // namespace attnprobe
