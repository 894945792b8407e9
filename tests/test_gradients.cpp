// Backward passes against their mathematics (docs/estimators/yoso.md "Backward pass", docs/metrics.md):
// YOSO-E's exact gradient against central finite differences in float64, the LSH estimate unbiased
// for the paper's lower bound, the sparse form equal to the lower bound on colliding pairs, the
// closed-form backward of softmax, vmean and performer against finite differences, and the gradient
// metrics in a sweep.
#include <cmath>
#include <limits>
#include <numbers>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/estimators/yoso/yoso_backward.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/metrics.h"
#include "attnprobe/sweep/budget.h"
#include "attnprobe/sweep/plan.h"
#include "attnprobe/sweep/runner.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

MatrixD normal_matrix(int64_t rows, int64_t cols, uint32_t tag) {
  const RandomStream s(make_random_key(21, "gradient test", tag), Purpose::kGeneric);
  MatrixD x(rows, cols);
  for (int64_t i = 0; i < rows; ++i) s.normals(static_cast<uint32_t>(i), 0, x.row(i).data(), cols);
  return x;
}

// L = ⟨G, W·V⟩ with W_ij = (1 − acos(q̂_i·k̂_j)/π)^τ, q̂ free (not renormalised), in float64.
double yoso_loss(const MatrixD& q_hat, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g, int tau) {
  const MatrixD x = q_hat * k_hat.transpose();
  const MatrixD w =
      x.unaryExpr([&](double c) { return std::pow(1 - std::acos(std::clamp(c, -1.0, 1.0)) / std::numbers::pi, tau); });
  return (g.array() * (w * v).array()).sum();
}

double relative(const MatrixD& a, const MatrixD& b) { return (a - b).norm() / b.norm(); }

Gradients backward_of(const std::string& spec, const HeadView& view, const MatrixD& g, uint32_t trial = 0) {
  return *parse_spec(spec).make()->backward(view, g, EstimateContext{make_random_key(8, spec, trial), nullptr});
}

}  // namespace

TEST_CASE("the exact YOSO-E gradient matches central finite differences in float64", "[gradients][yoso]") {
  // Unit rows, so the estimator's q̂ is the view's q and differences can move q̂ freely.
  const HeadView base = synth_slice(12, 8, 0.5, 13);
  const HeadView view = make_head_view(base.id, base.scale, normalize_rows(base.q), normalize_rows(base.k), base.v);
  const MatrixD g = normal_matrix(view.n(), view.pv(), 0);
  for (int tau : {1, 4, 8}) {
    const Gradients grad = backward_of(fmt::format("yoso-e(tau={})", tau), view, g);
    const MatrixD fd_q =
        central_differences(view.q, 1e-6, [&](const MatrixD& q) { return yoso_loss(q, view.k, view.v, g, tau); });
    const MatrixD fd_v =
        central_differences(view.v, 1e-6, [&](const MatrixD& v) { return yoso_loss(view.q, view.k, v, g, tau); });
    // Central differences at h = 1e-6: truncation ~h², rounding ~1e-16/h ≈ 1e-10. Observed relative
    // errors (∇_Q̂, ∇_V): τ = 1: 1.1e-9, 1.1e-9; τ = 4: 3.4e-10, 1.6e-9; τ = 8: 2.0e-10, 2.0e-9.
    INFO("tau " << tau << " relative error dQ " << relative(grad.q, fd_q) << " dV " << relative(grad.v, fd_v));
    CHECK(relative(grad.q, fd_q) < 1e-7);
    CHECK(relative(grad.v, fd_v) < 1e-7);
    CHECK(grad.pair_fraction == 1.0);
  }
}

TEST_CASE("the exact gradient is finite where q equals k (x = 1) and at x = -1", "[gradients][yoso]") {
  MatrixD q = normalize_rows(normal_matrix(6, 8, 1));
  MatrixD k = q;
  k.row(1) = -q.row(1);  // x = −1 for pair (1, 1); x = 1 on the others of the diagonal
  const MatrixD v = normal_matrix(6, 4, 2), g = normal_matrix(6, 4, 3);
  for (int tau : {1, 8}) {
    const Gradients grad = yoso_expectation_gradient(q, k, v, g, tau, false);
    CHECK(grad.q.allFinite());
    CHECK(grad.v.allFinite());
  }
}

TEST_CASE("YOSO-m's LSH gradient is unbiased for the lower bound over seeds", "[gradients][yoso][statistics]") {
  const HeadView view = synth_slice(32, 8, 0.5, 14);
  const MatrixD g = normal_matrix(view.n(), view.pv(), 4);
  for (const char* input : {"l2", "lift"}) {
    const Gradients bound = backward_of(fmt::format("yoso-e(tau=4,input={},grad=lower)", input), view, g);
    const std::string spec = fmt::format("yoso(m=4,tau=4,hash=gauss,norm=none,input={})", input);
    double q_error = 0, v_error = 0;
    const auto zq =
        weighted_z_scores([&](uint32_t t) { return backward_of(spec, view, g, t).q; }, bound.q, 2000, &q_error);
    const auto zv =
        weighted_z_scores([&](uint32_t t) { return backward_of(spec, view, g, t).v; }, bound.v, 2000, &v_error);
    for (int w = 0; w < 4; ++w) {
      // Observed (seed 8, 2000 seeds): all |z| ≤ 1.81 (l2) and ≤ 1.49 (lift).
      INFO(input << " weighting " << w << " z dQ " << zq[w] << " z dV " << zv[w]);
      CHECK(std::abs(zq[w]) < 4);
      CHECK(std::abs(zv[w]) < 4);
    }
    // The mean over 2000 seeds approaches the bound: observed 0.0155/0.0165 (l2), 0.0125/0.0156 (lift).
    INFO(input << " mean relative error dQ " << q_error << " dV " << v_error);
    CHECK(q_error < 0.15);
    CHECK(v_error < 0.15);
  }
}

TEST_CASE("the sparse gradient equals the dense lower bound restricted to colliding pairs", "[gradients][yoso]") {
  const HeadView view = synth_slice(40, 8, 0.5, 15);
  const MatrixD g = normal_matrix(view.n(), view.pv(), 5);
  for (const char* input : {"l2", "lift"}) {
    const int m = 3, tau = 4;
    const std::string spec = fmt::format("yoso(m={},tau={},hash=gauss,norm=l2,input={},grad=sparse)", m, tau, input);
    const Gradients sparse = backward_of(spec, view, g);
    MatrixD q_hat, k_hat;
    yoso_inputs(view.q, view.k, std::string(input) == "lift", q_hat, k_hat);
    const RandomKey key = make_random_key(8, spec, 0);
    const auto qc = lsh_codes(q_hat, m, tau, LshKind::kGauss, key), kc = lsh_codes(k_hat, m, tau, LshKind::kGauss, key);
    const int64_t n = view.n();
    MatrixD masked = MatrixD::Zero(n, n);  // W ⊙ [collides at least once]
    int64_t nnz = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        bool hit = false;
        for (int f = 0; f < m; ++f) hit = hit || qc[i * m + f] == kc[j * m + f];
        if (!hit) continue;
        ++nnz;
        masked(i, j) =
            std::pow(1 - std::acos(std::clamp(q_hat.row(i).dot(k_hat.row(j)), -1.0, 1.0)) / std::numbers::pi, tau);
      }
    const MatrixD dq = ((g * view.v.transpose()).array() * masked.array() * (0.5 * tau)).matrix() * k_hat;
    const MatrixD dv = masked.transpose() * g;
    // Same float64 sums in another order. Observed: 1.5e-16 (l2, nnz 483 of 1600), 1.7e-16 (lift, 748).
    INFO(input << " nnz " << nnz << " of " << n * n << " errors " << relative(sparse.q, dq) << " "
               << relative(sparse.v, dv));
    CHECK(relative(sparse.q, dq) < 1e-12);
    CHECK(relative(sparse.v, dv) < 1e-12);
    CHECK(sparse.pair_fraction == Approx(static_cast<double>(nnz) / (n * n)).epsilon(1e-12));
    REQUIRE(nnz < n * n);  // some pairs never collide, so the restriction is visible
  }
}

namespace {
HeadView causal(const HeadView& view) {
  return make_head_view(view.id, view.scale, view.q, view.k, view.v, Mask::kCausal);
}
// L = ⟨G, W·V⟩ of the causal form (W_ij = 0 for j > i), q̂ free.
double causal_yoso_loss(const MatrixD& q_hat, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g, int tau) {
  MatrixD w = (q_hat * k_hat.transpose()).unaryExpr([&](double c) {
    return std::pow(1 - std::acos(std::clamp(c, -1.0, 1.0)) / std::numbers::pi, tau);
  });
  w.triangularView<Eigen::StrictlyUpper>().setZero();
  return (g.array() * (w * v).array()).sum();
}
}  // namespace

TEST_CASE("yoso-e's causal backward matches central finite differences of the causal form", "[gradients][causal]") {
  // Central differences at h = 1e-6 in float64: truncation ~h², rounding ~1e-16/h ≈ 1e-10.
  const HeadView full = synth_slice(12, 8, 0.5, 23, 6);
  const HeadView view = causal(full);
  const MatrixD g = normal_matrix(view.n(), view.pv(), 12);
  const HeadView unit =
      make_head_view(view.id, view.scale, normalize_rows(view.q), normalize_rows(view.k), view.v, Mask::kCausal);
  for (int tau : {1, 8}) {
    const Gradients grad = backward_of(fmt::format("yoso-e(tau={})", tau), unit, g);
    const MatrixD fd_q = central_differences(
        unit.q, 1e-6, [&](const MatrixD& q) { return causal_yoso_loss(q, unit.k, unit.v, g, tau); });
    const MatrixD fd_v = central_differences(
        unit.v, 1e-6, [&](const MatrixD& v) { return causal_yoso_loss(unit.q, unit.k, v, g, tau); });
    // Observed (∇_Q̂, ∇_V): τ = 1: 6.2e-10, 6.0e-10; τ = 8: 1.7e-10, 1.0e-9.
    INFO("tau " << tau << " relative error dQ " << relative(grad.q, fd_q) << " dV " << relative(grad.v, fd_v));
    CHECK(relative(grad.q, fd_q) < 1e-7);
    CHECK(relative(grad.v, fd_v) < 1e-7);
    CHECK(grad.pair_fraction == 1.0);
  }
}

TEST_CASE("YOSO-m's causal gradients equal the masked lower bound on their own collisions",
          "[gradients][yoso][causal]") {
  // Per hash draw, grad=lsh is the lower bound with W replaced by the collision average B, and
  // grad=sparse the lower bound with exact W on the pairs colliding at least once; causal: j ≤ i only.
  const HeadView view = causal(synth_slice(40, 8, 0.5, 24));
  const MatrixD g = normal_matrix(view.n(), view.pv(), 13);
  const int m = 3, tau = 4;
  const int64_t n = view.n();
  for (const char* grad_form : {"lsh", "sparse"}) {
    const std::string spec = fmt::format("yoso(m={},tau={},hash=gauss,norm=l2,input=l2,grad={})", m, tau, grad_form);
    const Gradients grad = backward_of(spec, view, g);
    MatrixD q_hat, k_hat;
    yoso_inputs(view.q, view.k, false, q_hat, k_hat);
    const RandomKey key = make_random_key(8, spec, 0);
    const auto qc = lsh_codes(q_hat, m, tau, LshKind::kGauss, key), kc = lsh_codes(k_hat, m, tau, LshKind::kGauss, key);
    MatrixD b = MatrixD::Zero(n, n);  // lsh: B; sparse: W ⊙ [collides at least once]
    int64_t nnz = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        int hits = 0;
        for (int f = 0; f < m; ++f) hits += qc[i * m + f] == kc[j * m + f];
        if (std::string(grad_form) == "lsh") {
          b(i, j) = static_cast<double>(hits) / m;
        } else if (hits > 0) {
          ++nnz;
          b(i, j) =
              std::pow(1 - std::acos(std::clamp(q_hat.row(i).dot(k_hat.row(j)), -1.0, 1.0)) / std::numbers::pi, tau);
        }
      }
    const MatrixD dq = ((g * view.v.transpose()).array() * b.array() * (0.5 * tau)).matrix() * k_hat;
    const MatrixD dv = b.transpose() * g;
    // The same float64 sums in another order. Observed: lsh 1.9e-16, 1.4e-16; sparse 1.3e-16, 1.6e-16.
    INFO(grad_form << " errors " << relative(grad.q, dq) << " " << relative(grad.v, dv));
    CHECK(relative(grad.q, dq) < 1e-12);
    CHECK(relative(grad.v, dv) < 1e-12);
    if (std::string(grad_form) == "sparse") {
      // Of the n(n + 1)/2 visible pairs.
      CHECK(grad.pair_fraction == Approx(static_cast<double>(nnz) / (n * (n + 1) / 2)).epsilon(1e-12));
      REQUIRE(nnz < n * (n + 1) / 2);
    }
    // Row i of ∇_V sums over queries i′ ≥ i only: the last key's row is g_{n−1}'s share alone.
    CHECK(grad.v.row(n - 1).isApprox(b(n - 1, n - 1) * g.row(n - 1), 1e-12));
  }
}

namespace {
// A causal form with a full-mask backward only: what the plan's refusal of gradient metrics in causal
// cases is shown with (every shipped backward form has its causal form). Registered in this binary only.
class FullBackwardOnly final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out = MatrixF::Zero(view.n(), view.pv());
  }
  std::optional<Gradients> backward(const HeadView& view, const MatrixD&, const EstimateContext&) const override {
    return Gradients{MatrixD::Zero(view.n(), view.p()), MatrixD::Zero(view.k.rows(), view.pv())};
  }
};
[[maybe_unused]] const bool kFullBackwardRegistered = register_estimator(EstimatorDef{
    .name = "test-full-backward",
    .family = "test",
    .summary = "test only",
    .capabilities = {.random = false, .forms = kFullAndCausal, .backward = Backward::kOut, .backward_forms = kFullOnly},
    .make = [](const Spec&) { return std::make_unique<FullBackwardOnly>(); },
});
}  // namespace

TEST_CASE("gradient metrics of causal cases are refused for a backward without its causal form",
          "[gradients][causal]") {
  const Dump dump = Dump::open(write_synth("grad-causal.h5", synth_options(1, 1, 1, 32, 8)));
  SweepRequest request;
  request.mask = "causal";
  request.metrics = parse_metrics("grad_q_fro_rel");
  request.estimators = {"softmax", "vmean", "performer", "yoso", "yoso-e"};
  CHECK_NOTHROW(plan_sweep(dump, request));
  request.estimators = {"test-full-backward"};
  CHECK_THROWS_AS(plan_sweep(dump, request), UsageError);
  CHECK_THROWS_WITH(plan_sweep(dump, request), Catch::Contains("no backward pass for its causal form") &&
                                                   Catch::Contains("performer") && Catch::Contains("--mask full"));
  request.mask = "full";
  CHECK_NOTHROW(plan_sweep(dump, request));
}

TEST_CASE("the memory budget counts the backward pass when gradient metrics are asked for", "[gradients][budget]") {
  // performer(M=32768)'s backward holds four n × M float64 matrices (1 GiB at n = 1024) where its forward
  // pass holds blocks: --max-memory 300M let it run to a 1.08 GB peak.
  const Dump dump = Dump::open(write_synth("grad-budget.h5", synth_options(1, 1, 1, 1024, 8)));
  SweepRequest request;
  request.estimators = {"performer(M=32768)"};
  request.mask = "causal";
  request.metrics = parse_metrics("fro_rel");
  const double forward = estimate_budget(dump, plan_sweep(dump, request), 1).peak_bytes;
  request.metrics = parse_metrics("fro_rel,grad_v_fro_rel");
  const double backward = estimate_budget(dump, plan_sweep(dump, request), 1).peak_bytes;
  INFO("forward " << forward << " with the backward " << backward);
  CHECK(forward < 300e6);
  CHECK(backward > 4.0 * 8 * 1024 * 32768);  // observed 1.01 GiB
}

TEST_CASE("gradient metrics: zero against itself, NaN without a backward form of the reference's kind",
          "[gradients][metrics]") {
  const HeadView view = synth_slice(24, 8, 0.5, 19);
  const MatrixD g = normal_matrix(view.n(), view.pv(), 9);
  const std::vector<Metric> which = {Metric::kAngle, Metric::kGradQFroRel, Metric::kGradQAngle, Metric::kGradVFroRel,
                                     Metric::kGradPairs};
  const Gradients exact = backward_of("yoso-e(tau=8)", view, g),
                  bound = backward_of("yoso-e(tau=8,grad=lower)", view, g);
  std::vector<double> values(which.size(), 0.0);
  set_gradient_metrics(&exact, &exact, which, values);
  CHECK(values[0] == 0.0);  // output metrics untouched
  CHECK(values[1] == 0.0);
  CHECK(values[2] == Approx(0.0).margin(1e-7));  // acos of a rounded 1
  CHECK(values[3] == 0.0);
  CHECK(values[4] == 1.0);
  set_gradient_metrics(&exact, &bound, which, values);
  // The lower bound's own gap to the exact gradient (observed grad_q_fro_rel 0.41, grad_q_angle 0.065);
  // ∇_V = Wᵀ·G is the same for both.
  INFO("lower bound vs exact: grad_q_fro_rel " << values[1] << " grad_q_angle " << values[2]);
  CHECK(values[1] > 0.05);
  CHECK(values[3] < 1e-14);
  set_gradient_metrics(&exact, nullptr, which, values);
  CHECK(std::isnan(values[1]));
  CHECK(std::isnan(values[4]));
  CHECK(parse_metrics("all") == all_metrics());  // gradient metrics only when named
  CHECK(parse_metrics("grad_q_angle,grad_pairs") == std::vector<Metric>{Metric::kGradQAngle, Metric::kGradPairs});
}

TEST_CASE("gradient metrics do not depend on the upstream gradient's scale", "[gradients][metrics]") {
  // A dump's dy of 1e160 made every gradient metric NaN (squared norms overflowed), one of 1e-200 too (they
  // underflowed to 0). The gradients are linear in G, so the metrics are scale-free.
  const HeadView view = synth_slice(24, 8, 0.5, 25);
  const MatrixD g = normal_matrix(view.n(), view.pv(), 14);
  const std::vector<Metric> which = {Metric::kGradQFroRel, Metric::kGradQAngle, Metric::kGradVFroRel};
  std::vector<double> plain(which.size());
  const Gradients exact = backward_of("softmax", view, g), rough = backward_of("performer(M=8)", view, g);
  set_gradient_metrics(&exact, &rough, which, plain);
  for (double scale : {1e160, 1e-200}) {
    const Gradients big_exact = backward_of("softmax", view, scale * g),
                    big_rough = backward_of("performer(M=8)", view, scale * g);
    std::vector<double> scaled(which.size());
    set_gradient_metrics(&big_exact, &big_rough, which, scaled);
    for (size_t m = 0; m < which.size(); ++m) {
      INFO(metric_name(which[m]) << " at scale " << scale << ": " << scaled[m] << " vs " << plain[m]);
      CHECK(scaled[m] == Approx(plain[m]).epsilon(1e-12));
    }
  }
}

TEST_CASE("grad_q_angle is exact for equal gradients and precise for tiny angles", "[gradients][metrics]") {
  // The acos of the rows' cosine gave 7.5e-9 for equal gradients and 5.69e-8 for 5.0e-8 (see `angle`).
  Gradients exact, rough;
  exact.q = MatrixD(2, 2);
  exact.q << 3, 0, 0.5, 0.25;
  exact.v = MatrixD::Ones(2, 2);
  rough = exact;
  std::vector<double> values(1);
  set_gradient_metrics(&exact, &rough, {Metric::kGradQAngle}, values);
  CHECK(values[0] == 0.0);
  rough.q(0, 1) = 3e-7;  // row 0 turned by atan(1e-7), row 1 unchanged: mean atan(1e-7)/2
  set_gradient_metrics(&exact, &rough, {Metric::kGradQAngle}, values);
  CHECK(values[0] == Approx(std::atan(1e-7) / 2).epsilon(1e-12).margin(0));
}

TEST_CASE("a sweep computes gradient metrics only when asked, from a keyed upstream gradient", "[gradients][cli]") {
  const std::string dump = write_synth("grad.h5", synth_options(1, 1, 1, 64, 16));
  const std::string csv = temp_path("grad.csv");
  const auto result = run_attnprobe(fmt::format(
      "sweep {} -e 'yoso(m=8)' -e 'yoso(m=8,grad=sparse)' -e 'yoso-e(grad=lower)' -e vmean -e nystrom --lengths 64 "
      "--trials 2 --reference auto --metrics angle,grad_q_fro_rel,grad_v_fro_rel,grad_pairs -q -o {}",
      dump, csv));
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  const std::string text = read_text(csv);
  // yoso's gradient is compared with yoso-e's exact gradient: a finite error.
  CHECK(text.find("yoso(m=8,tau=8,hash=gauss,norm=l2,input=l2,grad=lsh)") != std::string::npos);
  CHECK(text.find(",grad_q_fro_rel,nan") != std::string::npos);  // yoso-e vs softmax, nystrom: no common form
  // The keyed G does not depend on the estimator or the trial; a prefix sees the prefix.
  const MatrixD g64 = upstream_gradient(0, SliceRef{0, 0, 0, 64}, 16),
                g32 = upstream_gradient(0, SliceRef{0, 0, 0, 32}, 16);
  CHECK(g64.topRows(32) == g32);
  INFO("mean of G " << g64.mean());
  CHECK(std::abs(g64.mean()) < 0.15);  // iid N(0, 1): the mean of 1024 values has sd 0.031
}

TEST_CASE("a dump's layer_NN/dy is the upstream gradient when present", "[gradients][dump]") {
  DumpContents contents = make_synthetic_dump(synth_options(1, 1, 1, 16, 8));
  const DumpArray& v = contents.layers[0].datasets.at("v");
  DumpArray dy{v.shape, std::vector<double>(v.values.size())};
  for (size_t e = 0; e < dy.values.size(); ++e) dy.values[e] = std::sin(0.7 * static_cast<double>(e));
  contents.layers[0].datasets["dy"] = dy;
  const std::string path = temp_path("with-dy.h5");
  write_dump(path, contents, DumpWriteOptions{StoredType::kFloat64, 0});
  const Dump dump = Dump::open(path);
  const std::optional<MatrixD> read = dump.read_upstream(0, 0, 0, 12);
  REQUIRE(read);
  CHECK(read->rows() == 12);
  CHECK((*read)(1, 2) == std::sin(0.7 * (1 * 8 + 2)));

  // The sweep's grad_v_fro_rel of vmean against softmax uses it.
  SweepRequest request;
  request.estimators = {"vmean"};
  request.lengths = {12};
  request.metrics = {Metric::kGradVFroRel};
  const SweepPlan plan = plan_sweep(dump, request);
  double value = 0;
  run_sweep(dump, plan, RunOptions{}, [&](const std::vector<TrialRow>& rows) {
    if (!rows.empty()) value = rows[0].value;
  });
  const HeadView view = dump.read_slice(0, 0, 0, 12);
  const Gradients exact = backward_of("softmax", view, *read), mean = backward_of("vmean", view, *read);
  std::vector<double> expected(1);
  set_gradient_metrics(&exact, &mean, request.metrics, expected);
  CHECK(value == expected[0]);
  const MatrixD keyed = upstream_gradient(0, SliceRef{0, 0, 0, 12}, view.pv());
  const Gradients exact_keyed = backward_of("softmax", view, keyed), mean_keyed = backward_of("vmean", view, keyed);
  set_gradient_metrics(&exact_keyed, &mean_keyed, request.metrics, expected);
  CHECK(value != expected[0]);  // not the keyed G

  // A dy of another shape is refused when the dump is opened.
  contents.layers[0].datasets["dy"] = DumpArray{{1, 1, 16, 3}, std::vector<double>(48, 0.0)};
  const std::string bad = temp_path("bad-dy.h5");
  write_dump(bad, contents, DumpWriteOptions{StoredType::kFloat64, 0});
  CHECK_THROWS_WITH(Dump::open(bad), Catch::Contains("must have the shape of v"));

  // A NaN in dy: `info` checks it with the slices (it said "all values finite" and eval then refused).
  DumpArray nan_dy = dy;
  nan_dy.values[5] = std::numeric_limits<double>::quiet_NaN();
  contents.layers[0].datasets["dy"] = nan_dy;
  const std::string with_nan = temp_path("nan-dy.h5");
  write_dump(with_nan, contents, DumpWriteOptions{StoredType::kFloat64, 0});
  const auto info = run_attnprobe("info " + with_nan);
  INFO(info.output);
  CHECK(info.exit_code == 3);
  CHECK_THAT(info.output, Catch::Contains("/layer_00/dy has a non-finite value"));
}
