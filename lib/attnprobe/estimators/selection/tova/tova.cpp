#include "attnprobe/estimators/selection/tova/tova.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/estimators/selection/replay.h"

namespace attnprobe {
namespace {

// kvpress's one-shot form: K_P = {P − 1} ∪ the budget − 1 best older prompt keys by the last prompt row's weights,
// computed as the replay computes them (below float32 the logits, then their softmax weights, stored in `precision`)
// and compared as stored (`ties` gets the ranking's counts).
std::vector<int64_t> compressed_prompt(const HeadView& view, int64_t P, int64_t budget, Share share,
                                       Precision precision, ScoreTies& ties) {
  std::vector<int64_t> kept(P);
  std::iota(kept.begin(), kept.end(), 0);
  if (P <= budget) return kept;
  std::vector<std::vector<double>> weights;  // each head's; a group ranks by their mean
  for (const ReplayMember& member : replay_members(view, share))
    weights.push_back(prefill_scores(member, PrefillScores::kLastRow, P, precision));
  kept.pop_back();  // P − 1 is forced; the rest compete
  const std::vector<double> mean = aggregate_scores(std::move(weights), kept, 0, Aggregate::kMean, false);
  kept = best_by_score(std::move(kept), mean, 0, budget - 1, precision, &ties);
  kept.push_back(P - 1);
  finish_kept(kept);
  return kept;
}

Share share_of(TovaHeads heads) {
  return heads == TovaHeads::kLayer ? Share::kLayer : heads == TovaHeads::kGroup ? Share::kGroup : Share::kHead;
}

class Tova final : public KeptKeysEstimator {
 public:
  explicit Tova(TovaParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    const int64_t P = replay_prompt(view, "tova");
    if (params_.mode == TovaMode::kPrefill) {
      require_usage(P > 0,
                    "tova(mode=prefill) compresses a prompt once, but the evaluated rows start at position 0: measure "
                    "the last rows with --queries last:W, W below the length (or use mode=replay).");
      ScoreTies ties;
      auto kept = std::make_shared<const std::vector<int64_t>>(
          compressed_prompt(view, P, params_.budget, share(), ctx.precision, ties));
      return rows_after_prompt(view, std::move(kept), P, ties);
    }
    const ReplayPolicy policy{.prefill = PrefillScores::kLastRow,
                              .accumulate = false,
                              .capacity = params_.budget,
                              .protect = 0,
                              .aggregate = ReplayAggregate::kMean,
                              .stored = ctx.precision};
    return replayed_rows(replay_sets(replay_members(view, share()), policy, P, view.first_position, view.keys()));
  }
  // The last prompt row's logits, then each row's cache of budget + 1 keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double cache = static_cast<double>(std::min(n, params_.budget + 1));
    return 2.0 * n * p + 2.0 * n * cache * (p + pv);
  }
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double cache = static_cast<double>(std::min(n, params_.budget + 1));
    return Estimator::memory_bytes(n, p, pv) + 8.0 * n * (2.0 + cache);
  }

 private:
  Share share() const { return share_of(params_.heads); }
  TovaParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<TovaParams>{
    .name = "tova",
    .family = "selection",
    .summary = "TOVA: a cache that drops the key the current row attends least, replayed step by step, or the "
               "prompt compressed once (mode=prefill; decode rows only)",
    .page = "estimators/selection.md",
    .params = ParamSet<TovaParams>()
                  .integer("budget", &TovaParams::budget, 1, int64_t{1} << 30,
                           "keys cached after each step (replay) or prompt keys kept, the last one included (prefill)")
                  .choice("heads", &TovaParams::heads,
                          {{"layer", TovaHeads::kLayer}, {"group", TovaHeads::kGroup}, {"head", TovaHeads::kHead}},
                          "layer: one cache for every head of the layer, scored by their mean weights (the "
                          "reference); group: one per kv group, by its heads' mean; head: one per query head")
                  .choice("mode", &TovaParams::mode, {{"replay", TovaMode::kReplay}, {"prefill", TovaMode::kPrefill}},
                          "replay: TOVA's eviction at every step; prefill: kvpress's one compression of the prompt "
                          "with its last key forced"),
    .samples_knob = "budget",
    // A cache built from key 0: causal decode rows only, after a prompt (replay: the prompt may be empty).
    .capabilities = replayed_scores_rounded(kDecodeAfterPrompt),
    .narrow =
        [](const TovaParams& params, Capabilities& can) {
          // Both modes score keys as the reference code does in the model's dtype (the one-shot form once, from the
          // last prompt row): the replay's rounding declaration is theirs.
          narrow_to_shared(share_of(params.heads), can);
        },
    .ablations = {"tova(budget=64,mode=prefill)"},
    .make = [](const TovaParams& params) { return std::make_unique<Tova>(params); },
});

}  // namespace
}  // namespace attnprobe
