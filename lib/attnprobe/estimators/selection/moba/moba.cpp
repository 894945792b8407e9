#include "attnprobe/estimators/selection/moba/moba.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

class Moba final : public KeptKeysEstimator {
 public:
  explicit Moba(MobaParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    // The mean key of every whole block, once per call (float64 sums of the float32 keys, in key order), stored
    // channel-major (means[d·whole + b]) so that a row's gates are a loop over contiguous blocks per channel.
    const int64_t whole = view.keys() / params_.block, p = view.p();
    auto means = std::make_shared<std::vector<double>>(static_cast<size_t>(p * whole));
    RowVectorD sum(p);
    for (int64_t b = 0; b < whole; ++b) {
      sum.setZero();
      for (int64_t j = b * params_.block; j < (b + 1) * params_.block; ++j) {
        const float* k = view.kf.row(j).data();
        for (int64_t d = 0; d < p; ++d) sum[d] += k[d];
      }
      for (int64_t d = 0; d < p; ++d) (*means)[d * whole + b] = sum[d] / static_cast<double>(params_.block);
    }
    return [&view, params = params_, means, whole, precision = ctx.precision](int64_t i) {
      const int64_t t = view.position(i), own = t / params.block;
      KeptKeys kept{{}, {}, static_cast<double>(own)};
      std::vector<int64_t> past(own);
      for (int64_t b = 0; b < own; ++b) past[b] = b;
      if (own > params.topk - 1) {
        // The gates s·q_t·k̄_b of the past blocks, each a dot product summed over the channels in order, for each
        // scoring head's query (the blocks side by side, so the loop over blocks vectorises); a group ranks by
        // their aggregate.
        const ScoringHeads heads = scoring_heads(view, params.share);
        std::vector<std::vector<double>> gates(heads.size(), std::vector<double>(own, 0.0));
        for (int h = 0; h < heads.size(); ++h) {
          const float* q = heads.rows[h]->row(i).data();
          double* gate = gates[h].data();
          for (int64_t d = 0; d < view.p(); ++d) {
            const double qd = q[d];
            const double* mean = means->data() + d * whole;
            for (int64_t b = 0; b < own; ++b) gate[b] += qd * mean[b];
          }
          for (int64_t b = 0; b < own; ++b) gate[b] *= view.scale;
        }
        const std::vector<double> gate = aggregate_scores(std::move(gates), past, 0, params.agg, /*logits=*/true);
        past = best_by_score(std::move(past), gate, 0, params.topk - 1, precision, &kept.ties);
        std::sort(past.begin(), past.end());  // disjoint blocks in order: the kept keys come out sorted
      }
      for (int64_t b : past) append_range(kept.keys, b * params.block, (b + 1) * params.block);
      append_range(kept.keys, own * params.block, t + 1);
      finish_kept(kept.keys);
      return kept;
    };
  }
  // Per row: one gate per past block, then at most topk blocks of keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.topk * params_.block));
    return 2.0 * n * (static_cast<double>(n) / static_cast<double>(params_.block) * p + kept * (p + pv));
  }

 private:
  MobaParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<MobaParams>{
    .name = "moba",
    .family = "selection",
    .summary = "MoBA's block gate at decode: the query's own block and the past blocks whose mean key scores best",
    .page = "estimators/selection.md",
    .params = with_sharing(ParamSet<MobaParams>()
                               .integer("block", &MobaParams::block, 1, int64_t{1} << 20, "keys per block")
                               .integer("topk", &MobaParams::topk, 1, int64_t{1} << 20,
                                        "blocks attended, the query's own included (the samples knob)")),
    .samples_knob = "topk",
    // Blocks are positions from key 0 up to the query: causal only.
    .capabilities = {.random = false,
                     .forms = {Mask::kCausal},
                     .decode = {Mask::kCausal},
                     .weights = {Mask::kCausal},
                     .selection = true,
                     .rounding = kRankingScoresRounded},
    .narrow = narrow_sharing<MobaParams>,
    .ablations = {"moba(block=16,topk=3)", "moba(block=8,topk=3,share=group,agg=max)"},
    .make = [](const MobaParams& params) { return std::make_unique<Moba>(params); },
});

}  // namespace
}  // namespace attnprobe
