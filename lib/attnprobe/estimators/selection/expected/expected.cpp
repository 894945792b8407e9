#include "attnprobe/estimators/selection/expected/expected.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

// One head's π over the candidates [sink, P) (index j − sink), from its prompt rows [sink, P).
std::vector<double> expected_weights(const MatrixF& prompt, const MatrixF& keys, double scale,
                                     const ExpectedParams& o) {
  const int64_t P = prompt.rows(), rows = P - o.sink;
  const MatrixD q = prompt.bottomRows(rows).cast<double>();
  const Eigen::RowVectorXd mean = q.colwise().mean();
  MatrixD spread;
  if (o.cov) {
    const MatrixD centred = q.rowwise() - mean;
    spread = (centred.transpose() * centred) / static_cast<double>(rows);  // divided by the count
  }
  std::vector<double> z(rows);
  double top = -INFINITY;
  for (int64_t j = o.sink; j < P; ++j) {
    const Eigen::RowVectorXd k = keys.row(j).cast<double>();
    double score = scale * k.dot(mean);
    if (o.cov) score += 0.5 * scale * scale * k.dot(k * spread);  // Σ is symmetric
    z[j - o.sink] = score;
    top = std::max(top, score);
  }
  double total = 0;
  for (double& value : z) total += value = std::exp(value - top);
  for (double& value : z) value /= total;
  return z;
}

// The kept prompt keys K_P, ascending.
// Its scores are compared as stored in `precision`; `ties` gets the ranking's counts.
std::vector<int64_t> kept_prompt(const HeadView& view, int64_t P, const ExpectedParams& o, Precision precision,
                                 ScoreTies& ties) {
  std::vector<int64_t> kept;
  if (P <= o.budget) {
    append_range(kept, 0, P);
    return kept;
  }
  const ScoringHeads heads = scoring_heads(view, o.share);
  std::vector<std::vector<double>> weights;
  for (const MatrixF* prompt : heads.prompt)
    weights.push_back(expected_weights(prompt->topRows(P), view.kf, view.scale, o));
  std::vector<int64_t> candidates(P - o.sink);
  for (int64_t j = o.sink; j < P; ++j) candidates[j - o.sink] = j;
  std::vector<double> score = aggregate_scores(std::move(weights), candidates, o.sink, o.agg, /*logits=*/false);
  if (o.vnorm)
    for (int64_t j = o.sink; j < P; ++j)
      score[j - o.sink] = (score[j - o.sink] + o.eps) * view.vf.row(j).cast<double>().norm();
  kept = best_by_score(std::move(candidates), score, o.sink, o.budget - o.sink, precision, &ties);
  append_range(kept, 0, o.sink);
  finish_kept(kept);
  return kept;
}

class Expected final : public KeptKeysEstimator {
 public:
  explicit Expected(ExpectedParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    const int64_t P = compressed_prompt_end(view, "expected");
    require_input(P > params_.sink + 1,
                  "expected(sink={}) models future queries from the prompt's rows after its sinks, but the evaluated "
                  "rows start at position {}: use a smaller W in --queries last:W, a longer --lengths, or fewer sinks.",
                  params_.sink, P);
    ScoreTies ties;
    auto kept = std::make_shared<const std::vector<int64_t>>(kept_prompt(view, P, params_, ctx.precision, ties));
    return rows_after_prompt(view, std::move(kept), P, ties);
  }
  // The statistics and the expected scores (once), then each row's kept keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.budget));
    return 4.0 * static_cast<double>(n) * p * p + 2.0 * n * kept * (p + pv);
  }

 private:
  ExpectedParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<ExpectedParams>{
    .name = "expected",
    .family = "selection",
    .summary = "Expected Attention: the prompt's cache compressed once by the weights its queries' statistics "
               "predict (decode rows only)",
    .page = "estimators/selection.md",
    .params = with_sharing(ParamSet<ExpectedParams>()
                               .integer("budget", &ExpectedParams::budget, 1, int64_t{1} << 30,
                                        "prompt keys kept, the sinks included (>= the prompt: exact)")
                               .integer("sink", &ExpectedParams::sink, 0, int64_t{1} << 30,
                                        "the first keys, kept and left out of the query statistics")
                               .integer("cov", &ExpectedParams::cov, 0, 1, "1: the covariance term s^2 k'Sk/2")
                               .integer("vnorm", &ExpectedParams::vnorm, 0, 1, "1: scores times the value norms")
                               .real("eps", &ExpectedParams::eps, 0, 1, "added to the weights before the value norm"))
                  .check([](const ExpectedParams& p) {
                    require_usage(p.budget >= p.sink,
                                  "expected: budget={} is below sink={}; the budget counts the sinks (fewer sinks, "
                                  "or a larger budget)",
                                  p.budget, p.sink);
                  }),
    .samples_knob = "budget",
    .capabilities = ranking_scores_rounded(kDecodeAfterPrompt),
    .narrow = narrow_sharing<ExpectedParams>,
    .ablations = {"expected(budget=32,sink=2,cov=0,vnorm=0,share=head)"},
    .make = [](const ExpectedParams& params) { return std::make_unique<Expected>(params); },
});

}  // namespace
}  // namespace attnprobe
