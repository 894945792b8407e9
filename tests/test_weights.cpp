// Attention-weight metrics (metrics/weight_metrics.h) and the weights each estimator states
// (Estimator::weights): one harness over the registry, plus closed forms for softmax and vmean.
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/weight_metrics.h"
#include "attnprobe/sweep/plan.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

TEST_CASE("the weights of yoso and yoso-e carry the l2 scale of their output rows", "[weights]") {
  // Rows of Â need not sum to one (docs/metrics.md): ‖Σ_j Â_ij·v_j‖ = 1 for every row that met a key.
  const HeadView view = synth_slice(200, 8, 0.5, 2);
  for (const std::string text : {"yoso-e", "yoso(m=16)"}) {
    const auto estimator = parse_spec(text).make();
    const MatrixD w = estimator->weights(view, EstimateContext{make_random_key(9, text, 0), nullptr})(0, 200);
    const VectorD norms = (w * view.v).rowwise().norm();
    INFO(text << ": largest |norm - 1| " << (norms.array() - 1).abs().maxCoeff() << ", mean row sum "
              << w.rowwise().sum().mean());
    CHECK((norms.array() - 1).abs().maxCoeff() < 1e-12);  // every row met a key here; observed ≤ 1.0e-15
    // The scale is not one: observed mean row sums 0.440 (yoso-e), 0.441 (yoso).
    CHECK(std::abs(w.rowwise().sum().mean() - 1) > 0.1);
  }
}

TEST_CASE("performer's causal weights stay distributions at large logits", "[weights][causal]") {
  // Row norms ~30 at s = 1/4: the per-feature key shifts (and the log-space fallback) keep every row of
  // performer's causal weights a distribution.
  const HeadView base = synth_slice(200, 8, 0.3, 15);
  const HeadView peaked = make_head_view(base.id, base.scale, 30.0 * base.q, 30.0 * base.k, base.v, Mask::kCausal);
  const MatrixD w =
      parse_spec("performer").make()->weights(peaked, EstimateContext{make_random_key(1, "p", 0), nullptr})(0, 200);
  CHECK(w.allFinite());
  CHECK((w.rowwise().sum().array() - 1).abs().maxCoeff() < 1e-12);  // observed 2.2e-16
}

TEST_CASE("weights of the full-mask forms are refused under the causal mask", "[weights]") {
  // Their Â is the full-mask one; stating it for a causal case would compare the wrong matrix.
  HeadView view = synth_slice(64, 8, 0.5, 3);
  view.mask = Mask::kCausal;
  for (const std::string text : {"lara", "favorpp", "hyper", "kdeformer", "linformer", "linformer-jlt"}) {
    INFO(text);
    CHECK_THROWS_AS(parse_spec(text).make()->weights(view, EstimateContext{make_random_key(1, text, 0), nullptr}),
                    UsageError);
  }
}

TEST_CASE("weight metrics of softmax and vmean in closed form", "[weights]") {
  const HeadView view = synth_slice(200, 8, 0.5, 2);
  const std::vector<Metric> which = weight_metrics();
  const auto exact = attention_weight_metrics(
      view, [&](int64_t r0, int64_t rows) { return attention_rows_f64(view.q, view.k, view.scale, r0, rows); }, which);
  CHECK(exact[0] == 0);               // row_tv
  CHECK(std::abs(exact[1]) < 1e-15);  // row_kl, observed ~3e-17
  CHECK(exact[2] == 1);               // topk_recall
  // vmean: Â = 1/n. row_tv = mean_i ½Σ_j|1/n − A_ij|, row_kl = mean_i Σ_j A_ij·log(n·A_ij).
  double tv = 0, kl = 0;
  const MatrixD a = attention_rows_f64(view.q, view.k, view.scale, 0, view.n());
  for (int64_t i = 0; i < view.n(); ++i)
    for (int64_t j = 0; j < view.n(); ++j) {
      tv += 0.5 * std::abs(1.0 / view.n() - a(i, j)) / view.n();
      kl += a(i, j) * std::log(view.n() * a(i, j)) / view.n();
    }
  const auto uniform = attention_weight_metrics(
      view, [&](int64_t, int64_t rows) { return MatrixD::Constant(rows, view.n(), 1.0 / view.n()); }, which);
  CHECK(uniform[0] == Approx(tv).epsilon(1e-12));
  CHECK(uniform[1] == Approx(kl).epsilon(1e-12));
  // Uniform weights tie everywhere: top-k are keys 0..7; recall = how often those are A's top 8.
  CHECK(uniform[2] >= 0);
  CHECK(uniform[2] < 0.5);
}

TEST_CASE("row_kl is never negative and topk_recall counts tied keys as found", "[weights]") {
  const std::vector<Metric> which = weight_metrics();
  // Â = A: the KL divergence is 0, its float64 evaluation a residue of either sign (before the clamp, −4e-17
  // on some of these seeds: the renormalisation divides by a row sum of 1 ± ulps).
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    INFO(seed);
    const HeadView view = synth_slice(96, 8, 0.5, seed);
    const auto exact = attention_weight_metrics(
        view, [&](int64_t r0, int64_t rows) { return attention_rows_f64(view.q, view.k, view.scale, r0, rows); },
        which);
    CHECK(exact[1] >= 0);
    CHECK(exact[1] < 1e-15);
  }
  // Keys 3j, 3j + 1 and 3j + 2 equal: the exact top 8 of a row is two triples and two keys of a third,
  // the lower two by the tie rule. An estimate that is A with its ties broken the other way (key 3j + 2 a
  // hair above its twins) finds keys as heavy: recall 1 (the set intersection with ties to the lower
  // index gave 7/8 on every row).
  const HeadView base = synth_slice(63, 8, 0.5, 4);
  MatrixD k = base.k;
  for (int64_t j = 0; j + 2 < k.rows(); j += 3) k.row(j + 1) = k.row(j + 2) = k.row(j);
  const HeadView twins = make_head_view(base.id, base.scale, base.q, k, base.v);
  const auto flipped = attention_weight_metrics(
      twins,
      [&](int64_t r0, int64_t rows) {
        MatrixD a = attention_rows_f64(twins.q, twins.k, twins.scale, r0, rows);
        for (int64_t j = 2; j < a.cols(); j += 3) a.col(j) *= 1 + 1e-12;
        return a;
      },
      which);
  CHECK(flipped[2] == 1);
  // A genuinely wrong ranking still costs: the reversed row finds none of the top 8 among 64 distinct keys.
  const HeadView distinct = synth_slice(64, 8, 2.0, 5);
  const auto reversed = attention_weight_metrics(
      distinct,
      [&](int64_t r0, int64_t rows) {
        return MatrixD(1.0 - attention_rows_f64(distinct.q, distinct.k, distinct.scale, r0, rows).array());
      },
      which);
  CHECK(reversed[2] == 0);
}

namespace {
// A causal form that states full-mask weights only (every shipped causal form states both): what the
// plan's refusal of weight metrics in causal cases is shown with. Registered in this binary only.
class ZeroCausal final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out = MatrixF::Zero(view.n(), view.pv());
  }
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    require_usage(view.mask == Mask::kFull, "test-causal: full-mask weights only");
    return [keys = view.k.rows()](int64_t, int64_t rows) { return MatrixD::Zero(rows, keys); };
  }
};
[[maybe_unused]] const bool kCausalTestRegistered = register_estimator(EstimatorDef{
    .name = "test-causal",
    .family = "test",
    .summary = "test only",
    .capabilities = {.random = false, .forms = kFullAndCausal, .weights = kFullOnly},
    .make = [](const Spec&) { return std::make_unique<ZeroCausal>(); },
});
}  // namespace

TEST_CASE("weight metrics of causal cases are refused for causal forms that state no weights", "[weights][causal]") {
  const Dump dump = Dump::open(write_synth("causal-weights.h5", synth_options(1, 1, 1, 64, 8)));
  SweepRequest request;
  request.estimators = {"performer", "test-causal"};
  request.metrics = parse_metrics("spec_rel,row_tv");
  request.mask = "causal";
  CHECK_THROWS_WITH(plan_sweep(dump, request), Catch::Contains("'test-causal' does not state the attention weights "
                                                               "of its causal form") &&
                                                   Catch::Contains("performer") && Catch::Contains("--mask full"));
  request.mask = "full";
  CHECK_NOTHROW(plan_sweep(dump, request));
  request.estimators = {"performer", "scatterbrain", "yoso", "softmax"};
  request.mask = "causal";
  CHECK_NOTHROW(plan_sweep(dump, request));
}

TEST_CASE("weight metrics are refused for estimators that state no weights", "[weights][cli]") {
  const std::string dump_path = write_synth("weights.h5", synth_options(1, 1, 1, 64, 8));
  // Every shipped estimator states its weights now; the refusal is the plan's, shown with the registry
  // test's `test-params` (an estimator without weights, registered in this binary only).
  const Dump dump = Dump::open(dump_path);
  SweepRequest request;
  request.estimators = {"test-params"};
  request.metrics = parse_metrics("spec_rel,row_tv");
  CHECK_THROWS_AS(plan_sweep(dump, request), UsageError);
  CHECK_THROWS_WITH(plan_sweep(dump, request),
                    Catch::Contains("cannot state the attention weights") && Catch::Contains("softmax"));
  const auto ok =
      run_attnprobe("eval " + dump_path + " -e vmean -e 'skeinformer(d=8)' -e 'yoso(m=8)' --metrics weights -q");
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("topk_recall"));
}
