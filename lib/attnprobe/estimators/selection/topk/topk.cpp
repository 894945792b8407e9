#include "attnprobe/estimators/selection/topk/topk.h"

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

class Topk final : public KeptKeysEstimator {
 public:
  explicit Topk(TopkParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    return [&view, params = params_, precision = ctx.precision](int64_t i) {
      const KeyRange seen = view.visible(i);
      std::vector<int64_t> rest;  // R_t
      KeptKeys kept = oracle_fixed_part(view, i, params.sink, params.window, rest);
      if (params.k >= static_cast<int64_t>(rest.size())) {  // every key: no scores needed
        kept.keys.insert(kept.keys.end(), rest.begin(), rest.end());
      } else {
        std::vector<std::vector<double>> scores;
        for (const MatrixF* rows : scoring_heads(view, params.share).rows)
          scores.push_back(score_visible(view, *rows, i));
        const std::vector<double> shared =
            aggregate_scores(std::move(scores), rest, seen.begin, params.agg, /*logits=*/true);
        const std::vector<int64_t> best =
            best_by_score(std::move(rest), shared, seen.begin, params.k, precision, &kept.ties);
        kept.keys.insert(kept.keys.end(), best.begin(), best.end());
      }
      finish_kept(kept.keys);
      return kept;
    };
  }
  // The scores of every visible key (p each), then the kept keys' logits and values.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.k + params_.sink + params_.window));
    return 2.0 * n * (static_cast<double>(n) * p + kept * (p + pv));
  }

 private:
  TopkParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<TopkParams>{
    .name = "topk",
    .family = "selection",
    .summary = "oracle top-k: each row attends its k highest-scoring keys (plus sink and window keys), exact logits",
    .page = "estimators/selection.md",
    .params = with_sharing(ParamSet<TopkParams>()
                               .integer("k", &TopkParams::k, 0, int64_t{1} << 30,
                                        "keys kept by score beyond sink and window (k >= the rest: exact)")
                               .integer("sink", &TopkParams::sink, 0, int64_t{1} << 30, "the first keys, always kept")
                               .integer("window", &TopkParams::window, 0, int64_t{1} << 30,
                                        "the last keys up to the query's own, always kept")),
    .samples_knob = "k",
    .capabilities = kOracleSelection,
    .narrow =
        [](const TopkParams& params, Capabilities& can) {
          positional_forms(params.sink, params.window, can);
          narrow_sharing(params, can);
        },
    .ablations = {"topk(k=32,sink=4,window=16)", "topk(k=32,share=group,agg=logit)"},
    .make = [](const TopkParams& params) { return std::make_unique<Topk>(params); },
});

}  // namespace
}  // namespace attnprobe
