#include "attnprobe/estimators/selection/snapkv/snapkv.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {

std::vector<double> pool_votes(const std::vector<double>& votes, int64_t kernel, SnapkvPool pool) {
  const int64_t count = static_cast<int64_t>(votes.size()), half = kernel / 2;
  std::vector<double> pooled(votes.size());
  for (int64_t j = 0; j < count; ++j) {
    const int64_t lo = std::max<int64_t>(0, j - half), hi = std::min(count - 1, j + half);
    if (pool == SnapkvPool::kAvg) {
      double sum = 0;
      for (int64_t d = lo; d <= hi; ++d) sum += votes[d];
      pooled[j] = sum / static_cast<double>(kernel);  // the padding counts in the divisor
    } else {
      pooled[j] = *std::max_element(votes.begin() + lo, votes.begin() + hi + 1);
    }
  }
  return pooled;
}

namespace {

// One head's pooled votes over the candidates [0, P − window).
std::vector<double> pooled_votes(const MatrixF& prompt, const MatrixF& keys, double scale, const SnapkvParams& o) {
  const int64_t P = prompt.rows(), p = prompt.cols(), candidates = P - o.window;
  std::vector<double> votes(candidates, 0.0), logits;
  for (int64_t i = candidates; i < P; ++i) {  // row i sees keys 0..i
    logits.resize(i + 1);
    double top = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) {
      logits[j] = scale * widened_dot(prompt.row(i).data(), keys.row(j).data(), p);
      top = std::max(top, logits[j]);
    }
    double total = 0;
    for (double& l : logits) total += l = std::exp(l - top);
    for (int64_t j = 0; j < candidates; ++j) votes[j] += logits[j] / total;
  }
  return pool_votes(votes, o.kernel, o.pool);
}

// The kept prompt keys K_P, ascending, for a prompt of P tokens (the header's steps).
// Its scores are compared as stored in `precision`; `ties` gets the ranking's counts.
std::vector<int64_t> kept_prompt(const HeadView& view, int64_t P, const SnapkvParams& o, Precision precision,
                                 ScoreTies& ties) {
  std::vector<int64_t> kept;
  if (P <= o.budget) {
    append_range(kept, 0, P);
    return kept;
  }
  const int64_t candidates = P - o.window;
  std::vector<std::vector<double>> votes;
  for (const MatrixF* prompt : scoring_heads(view, o.share).prompt)
    votes.push_back(pooled_votes(prompt->topRows(P), view.kf, view.scale, o));
  std::vector<int64_t> all(candidates);
  for (int64_t j = 0; j < candidates; ++j) all[j] = j;
  const std::vector<double> pooled = aggregate_scores(std::move(votes), all, 0, o.agg, /*logits=*/false);
  kept = best_by_score(std::move(all), pooled, 0, o.budget - o.window, precision, &ties);
  append_range(kept, candidates, P);
  finish_kept(kept);
  return kept;
}

class Snapkv final : public KeptKeysEstimator {
 public:
  explicit Snapkv(SnapkvParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    const int64_t P = compressed_prompt_end(view, "snapkv");
    require_input(
        P > params_.window,
        "snapkv(window={}) needs a prompt longer than its observation window, but the evaluated rows start at "
        "position {}: use a smaller W in --queries last:W, a longer --lengths, or a smaller window.",
        params_.window, P);
    ScoreTies ties;
    auto kept = std::make_shared<const std::vector<int64_t>>(kept_prompt(view, P, params_, ctx.precision, ties));
    return rows_after_prompt(view, std::move(kept), P, ties);
  }
  // The votes of the window rows over the prompt (once), then each row's kept keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.budget));
    return 2.0 * static_cast<double>(params_.window) * static_cast<double>(n) * p + 2.0 * n * kept * (p + pv);
  }

 private:
  SnapkvParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<SnapkvParams>{
    .name = "snapkv",
    .family = "selection",
    .summary = "SnapKV: the prompt's cache compressed once by the pooled votes of its last queries (decode rows only)",
    .page = "estimators/selection.md",
    .params =
        with_sharing(ParamSet<SnapkvParams>()
                         .integer("window", &SnapkvParams::window, 1, int64_t{1} << 20,
                                  "observation rows at the prompt's end (their keys are kept)")
                         .integer("budget", &SnapkvParams::budget, 1, int64_t{1} << 30,
                                  "prompt keys kept, the window's included (>= the prompt: exact)")
                         .integer("kernel", &SnapkvParams::kernel, 1, 1023, "pooling width over the votes (odd)")
                         .choice("pool", &SnapkvParams::pool, {{"avg", SnapkvPool::kAvg}, {"max", SnapkvPool::kMax}},
                                 "pooling: avg (zero padding counted, as avg_pool1d) or max"))
            .check([](const SnapkvParams& p) {
              require_usage(p.kernel % 2 == 1,
                            "snapkv: kernel={} is even; the pooled votes keep their length with an odd kernel "
                            "only (as the reference's padding kernel/2)",
                            p.kernel);
              require_usage(p.budget >= p.window,
                            "snapkv: budget={} is below window={}; the budget counts the window's keys (lower "
                            "the window, or raise the budget)",
                            p.budget, p.window);
            }),
    .samples_knob = "budget",
    // Positions from key 0: causal decode rows only, after a prompt.
    .capabilities = ranking_scores_rounded(kDecodeAfterPrompt),
    .narrow = narrow_sharing<SnapkvParams>,
    .ablations = {"snapkv(window=8,budget=32,kernel=7,pool=max)", "snapkv(window=8,budget=32,share=group,agg=max)"},
    .make = [](const SnapkvParams& params) { return std::make_unique<Snapkv>(params); },
});

}  // namespace
}  // namespace attnprobe
