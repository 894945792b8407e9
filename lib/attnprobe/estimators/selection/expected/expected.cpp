#include "attnprobe/estimators/selection/expected/expected.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

// R_τ of the rotary embedding with rotate_half pairing: (R x)_f = cos(τθ_f)·x_f − sin(τθ_f)·x_{f+h} and
// (R x)_{f+h} = cos(τθ_f)·x_{f+h} + sin(τθ_f)·x_f, h = p/2; R_τ = diag(c) + diag(s)·J as a p × p matrix from the
// cosines and sines of each pair.
MatrixD rotation(const std::vector<double>& cosines, const std::vector<double>& sines) {
  const int64_t h = static_cast<int64_t>(cosines.size());
  MatrixD r = MatrixD::Zero(2 * h, 2 * h);
  for (int64_t f = 0; f < h; ++f) {
    r(f, f) = r(f + h, f + h) = cosines[f];
    r(f, f + h) = -sines[f];
    r(f + h, f) = sines[f];
  }
  return r;
}

// The prompt rows [sink, P) as the statistics read them: as dumped (stats=post), or un-rotated to their pre-RoPE
// values R_iᵀq_i, row i at position i (stats=rope).
MatrixD statistics_rows(const MatrixF& prompt, const ExpectedParams& o, const std::vector<double>* frequencies) {
  const int64_t P = prompt.rows(), rows = P - o.sink;
  MatrixD q = prompt.bottomRows(rows).cast<double>();
  if (o.stats == ExpectedStats::kPost) return q;
  const int64_t h = static_cast<int64_t>(frequencies->size());
  for (int64_t r = 0; r < rows; ++r) {
    const double position = static_cast<double>(o.sink + r);
    for (int64_t f = 0; f < h; ++f) {
      const double angle = position * (*frequencies)[f], c = std::cos(angle), s = std::sin(angle);
      const double a = q(r, f), b = q(r, f + h);
      q(r, f) = c * a + s * b;  // Rᵀ: the rotation by −angle
      q(r, f + h) = c * b - s * a;
    }
  }
  return q;
}

// R̄ = (1/future)·Σ_{τ=P}^{P+future−1} R_τ (kvpress's apply_avg_rope): each pair's mean cosine and mean sine.
MatrixD mean_future_rotation(const std::vector<double>& frequencies, int64_t P, int64_t future) {
  std::vector<double> cosines(frequencies.size(), 0.0), sines(frequencies.size(), 0.0);
  for (size_t f = 0; f < frequencies.size(); ++f) {
    for (int64_t tau = P; tau < P + future; ++tau) {
      cosines[f] += std::cos(static_cast<double>(tau) * frequencies[f]);
      sines[f] += std::sin(static_cast<double>(tau) * frequencies[f]);
    }
    cosines[f] /= static_cast<double>(future);
    sines[f] /= static_cast<double>(future);
  }
  return rotation(cosines, sines);
}

// One head's π over the candidates [sink, P) (index j − sink), from its prompt rows [sink, P).
std::vector<double> expected_weights(const MatrixF& prompt, const MatrixF& keys, double scale, const ExpectedParams& o,
                                     const std::vector<double>* frequencies) {
  const int64_t P = prompt.rows(), rows = P - o.sink;
  const MatrixD q = statistics_rows(prompt, o, frequencies);
  Eigen::RowVectorXd mean = q.colwise().mean();
  MatrixD spread;
  if (o.cov) {
    const MatrixD centred = q.rowwise() - mean;
    spread = (centred.transpose() * centred) / static_cast<double>(rows);  // divided by the count
  }
  if (o.stats == ExpectedStats::kRope) {  // μ' = R̄μ̃, Σ' = R̄Σ̃R̄ᵀ
    const MatrixD average = mean_future_rotation(*frequencies, P, o.future);
    mean = (average * mean.transpose()).transpose();
    if (o.cov) spread = average * spread * average.transpose();
  }
  std::vector<double> z(rows);
  double top = -INFINITY;
  for (int64_t j = o.sink; j < P; ++j) {
    const Eigen::RowVectorXd k = keys.row(j).cast<double>();
    double score = scale * k.dot(mean);
    if (o.cov) score += 0.5 * scale * scale * k.dot(k * spread);  // Σ' is symmetric
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
    weights.push_back(expected_weights(prompt->topRows(P), view.kf, view.scale, o, view.rope_inv_freq.get()));
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
    require_input(params_.stats == ExpectedStats::kPost ||
                      (view.rope_inv_freq && 2 * static_cast<int64_t>(view.rope_inv_freq->size()) == view.p()),
                  "expected(stats=rope) un-rotates the prompt's queries by the model's rotary frequencies, which this "
                  "slice does not carry: give the dump's layer a rope_inv_freq array of P/2 inverse frequencies and "
                  "the root attribute rope_layout = \"half\" (docs/dumps.md, \"Rotary frequencies\"; in Python: "
                  "Layer(..., rope_inv_freq=...), Slice(..., rope_inv_freq=...) or capture(..., rope_inv_freq=...)), "
                  "or use stats=post.");
    ScoreTies ties;
    auto kept = std::make_shared<const std::vector<int64_t>>(kept_prompt(view, P, params_, ctx.precision, ties));
    return rows_after_prompt(view, std::move(kept), P, ties);
  }
  // The statistics and the expected scores (once; stats=rope: R̄Σ̃R̄ᵀ too), then each row's kept keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.budget));
    const double rotate = params_.stats == ExpectedStats::kRope ? 4.0 * p * p * p : 0.0;
    return 4.0 * static_cast<double>(n) * p * p + rotate + 2.0 * n * kept * (p + pv);
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
                               .integer("future", &ExpectedParams::future, 1, int64_t{1} << 20,
                                        "stats=rope: future positions the rotation is averaged over")
                               .integer("cov", &ExpectedParams::cov, 0, 1, "1: the covariance term s^2 k'Sk/2")
                               .integer("vnorm", &ExpectedParams::vnorm, 0, 1, "1: scores times the value norms")
                               .real("eps", &ExpectedParams::eps, 0, 1, "added to the weights before the value norm")
                               .choice("stats", &ExpectedParams::stats,
                                       {{"post", ExpectedStats::kPost}, {"rope", ExpectedStats::kRope}},
                                       "post: the dumped (rotated) queries' mean and covariance; rope: their pre-RoPE "
                                       "ones rotated over the future positions (needs the dump's rope_inv_freq)"))
                  .check([](const ExpectedParams& p) {
                    require_usage(p.budget >= p.sink,
                                  "expected: budget={} is below sink={}; the budget counts the sinks (fewer sinks, "
                                  "or a larger budget)",
                                  p.budget, p.sink);
                  }),
    .samples_knob = "budget",
    .capabilities = ranking_scores_rounded(kDecodeAfterPrompt),
    .narrow =
        [](const ExpectedParams& params, Capabilities& can) {
          narrow_sharing(params, can);
          can.rotary = params.stats == ExpectedStats::kRope;
        },
    .ablations = {"expected(budget=32,sink=2,cov=0,vnorm=0,share=head)"},
    .make = [](const ExpectedParams& params) { return std::make_unique<Expected>(params); },
});

}  // namespace
}  // namespace attnprobe
