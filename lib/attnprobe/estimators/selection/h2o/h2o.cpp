#include "attnprobe/estimators/selection/h2o/h2o.h"

#include <algorithm>
#include <memory>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/estimators/selection/replay.h"

namespace attnprobe {
namespace {

class H2o final : public KeptKeysEstimator {
 public:
  explicit H2o(H2oParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    const int64_t P = replay_prompt(view, "h2o");
    const ReplayPolicy policy{.prefill = PrefillScores::kColumnSums,
                              .accumulate = true,
                              .capacity = params_.heavy + params_.window - 1,
                              .protect = params_.window - 1,
                              .aggregate = replay_aggregate(params_.agg),
                              .stored = ctx.precision};
    return replayed_rows(replay_sets(replay_members(view, params_.share), policy, P, view.first_position, view.keys()));
  }
  // The prefill's column sums (n²/2 logits of 2p flops), then each row's cache of heavy + window keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double cache = static_cast<double>(std::min(n, params_.heavy + params_.window));
    return static_cast<double>(n) * n * p + 2.0 * n * cache * (p + pv);
  }
  // The float64 keys of the prompt, one block of prefill logits, and the sets of the evaluated rows.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double cache = static_cast<double>(std::min(n, params_.heavy + params_.window));
    return Estimator::memory_bytes(n, p, pv) + 8.0 * n * (p + 64.0 + cache);
  }

 private:
  H2oParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<H2oParams>{
    .name = "h2o",
    .family = "selection",
    .summary = "H2O: a cache of heavy hitters by accumulated attention and a recent window, replayed step by step "
               "(decode rows only)",
    .page = "estimators/selection.md",
    .params = with_sharing(ParamSet<H2oParams>()
                               .integer("heavy", &H2oParams::heavy, 0, int64_t{1} << 30,
                                        "keys kept beyond the window, by their accumulated attention")
                               .integer("window", &H2oParams::window, 1, int64_t{1} << 30,
                                        "the newest keys attended, the query's own included (H2O's recent_size + 1)")),
    .samples_knob = "heavy",
    // A cache replayed from key 0: causal decode rows only, after a prompt (the prompt may be empty).
    .capabilities = replayed_scores_rounded(kDecodeAfterPrompt),
    .narrow = narrow_sharing<H2oParams>,
    .ablations = {"h2o(heavy=32,window=1)", "h2o(heavy=16,window=8,share=group,agg=max)"},
    .make = [](const H2oParams& params) { return std::make_unique<H2o>(params); },
});

}  // namespace
}  // namespace attnprobe
