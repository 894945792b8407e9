// favorpp against its mathematics (docs/estimators/beyond.md, `favorpp`): A = 0 is Performer with the same
// draws, the per-feature variance formula against Monte Carlo, A* a minimiser of the pair-averaged log
// second moment, unbiased numerators and denominators for every variant, strict spec decoding.
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/estimators/random_features/favorpp/favorpp.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/registry.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

FavorppParams params_of(const std::string& spec) { return params_of<FavorppParams>(parse_spec(spec)); }

// A pair (x, y) of scaled vectors with entries N(0, std²), from a fixed stream.
std::pair<RowVectorD, RowVectorD> fixed_pair(int p, double std) {
  const RandomStream s(make_random_key(5, "pair", 0), Purpose::kGeneric);
  RowVectorD x(p), y(p);
  s.normals(0, 0, x.data(), p);
  s.normals(1, 0, y.data(), p);
  return {std * x, std * y};
}

}  // namespace

TEST_CASE("favorpp(a=0) is performer: the same draws, features and output", "[favorpp]") {
  const HeadView view = synth_slice(128, 16, 0.3, 4, 19);
  const RandomKey key = make_random_key(7, "identity", 0);
  for (int ortho : {0, 1}) {
    INFO("ortho " << ortho);
    const std::string suffix = fmt::format("M=48,ortho={}", ortho);
    GerfMap map;
    const MatrixD ours = favorpp_attention<double>(params_of("favorpp(a=0," + suffix + ")"), view, key, &map);
    // Feature level, float64: the same ω and log-features as performer's (features.h) up to the constant
    // −½·log M. Observed: projections identical bit for bit, log-features differ by at most 1.8e-15.
    const MatrixD omegas = draw_omegas(48, 16, ortho == 1, key);
    CHECK(map.projections == omegas);
    const MatrixD k_scaled = std::sqrt(view.scale) * view.k;
    const MatrixD expected = (log_features(k_scaled, omegas).array() - 0.5 * std::log(48.0)).matrix();
    const double feature_gap = (gerf_log_features<double>(map, k_scaled, 1.0, false) - expected).cwiseAbs().maxCoeff();
    INFO("feature gap " << feature_gap);
    CHECK(feature_gap < 1e-12);
    // Output level: performer computes in float32 (256-row blocks, per-feature key shifts; features.h),
    // so it agrees with the float64 favorpp to float32 accumulation accuracy, measured against the
    // row's norm (an entry-wise relative gap is meaningless for entries that cancel to near 0).
    // Observed: max over rows of ‖Δ_i‖/‖out_i‖ = 3.7e-7 (see INFO for each ortho setting).
    MatrixF performer;
    parse_spec("performer(" + suffix + ")").make()->estimate(view, EstimateContext{key, nullptr}, performer);
    const MatrixD gap = ours - performer.cast<double>();
    double row_gap = 0;
    for (int64_t i = 0; i < gap.rows(); ++i) row_gap = std::max(row_gap, gap.row(i).norm() / ours.row(i).norm());
    INFO("relative row gap to performer " << row_gap);
    CHECK(row_gap <= 2e-6);
    // The registered (float32) estimator, the same blocked pass with c_m = −½·log M added: the same numbers to float32
    // accuracy. Observed: 1.2e-7 and 1.3e-7 relative (ortho 0, 1: the added constant rounds the log-features).
    const MatrixF registered = run_estimator("favorpp(a=0," + suffix + ")", view);
    MatrixF direct;
    parse_spec("favorpp(a=0," + suffix + ")").make()->estimate(view, EstimateContext{key, nullptr}, direct);
    const double float_gap = (direct - performer).norm() / performer.norm();
    INFO("float32 gap " << float_gap);
    CHECK(float_gap < 1e-5);
    CHECK(registered.allFinite());
  }
}

TEST_CASE("favorpp's blocked float32 estimate equals its float64 formula for every variant", "[favorpp]") {
  // The estimator runs positive maps through Performer's blocked pass (feature_attention.h: 256-row
  // blocks, key chunks with per-feature online shifts, float32); favorpp_attention<double> forms the
  // n × M features whole in float64 under one shift per feature. Same draws and fit, so the outputs agree to
  // float32 accumulation accuracy: observed max over rows of ‖Δ_i‖/‖out_i‖ 3.9e-7 to 4.9e-7 (n = 700 spans
  // three key chunks and a partial block; 1e-5 leaves room for p and n, not for a wrong shift). And with a pool of 1 or
  // 2 threads the bits are the same.
  const HeadView view = synth_slice(700, 16, 0.5, 4, 23);
  const RandomKey key = make_random_key(9, "blocked", 0);
  for (const std::string spec :
       {"favorpp(M=40)", "favorpp(M=40,variant=arf)", "favorpp(M=40,variant=sderf)", "favorpp(M=40,a=-0.3,ortho=0)"}) {
    INFO(spec);
    const MatrixD expected = favorpp_attention<double>(params_of(spec), view, key);
    const PooledEstimates pooled = estimate_with_pools(spec, view, key);
    const MatrixD gap = pooled.alone.cast<double>() - expected;
    double row_gap = 0;
    for (int64_t i = 0; i < gap.rows(); ++i) row_gap = std::max(row_gap, gap.row(i).norm() / expected.row(i).norm());
    INFO("relative row gap " << row_gap);
    CHECK(row_gap < 1e-5);
    CHECK(pooled.one_thread == pooled.alone);
    CHECK(pooled.two_threads == pooled.alone);
  }
}

TEST_CASE("fit_gerf from the float32 copy is the fit from its float64 widening, on any pool", "[favorpp]") {
  // gerf.h: the statistics are summed in float64 whatever the input's type, in fixed row groups, so the
  // estimate (view.qf, view.kf) and weights() (view.q, view.k) fit the same map when the float32 copy is
  // exact. n = 1500 spans several 256-row blocks of sderf's Gram matrices in each of the 8 groups.
  const HeadView view = synth_slice(1500, 16, 0.5, 4, 29);
  const MatrixD q_widened = view.qf.cast<double>(), k_widened = view.kf.cast<double>();
  ThreadPool two(2);
  for (const GerfVariant variant : {GerfVariant::kOprf, GerfVariant::kArf, GerfVariant::kSderf}) {
    INFO("variant " << static_cast<int>(variant));
    GerfOptions options;
    options.variant = variant;
    const RandomKey key = make_random_key(3, "fit", 0);
    const GerfMap from_double = fit_gerf(options, q_widened, k_widened, view.scale, 24, true, key);
    const GerfMap from_float = fit_gerf(options, view.qf, view.kf, view.scale, 24, true, key, &two);
    CHECK(from_float.projections == from_double.projections);
    CHECK(from_float.offsets == from_double.offsets);
    CHECK(from_float.query_scale == from_double.query_scale);
    CHECK(from_float.key_scale == from_double.key_scale);
    CHECK(from_float.a == from_double.a);
  }
}

TEST_CASE("favorpp's per-feature variance formula matches Monte Carlo and the mean is exp(x.y)",
          "[favorpp][statistics]") {
  const int p = 16, draws = 200000;
  const auto [x, y] = fixed_pair(p, 0.18);
  const double z = (x + y).squaredNorm();
  const double a_opt = oprf_optimal_a(z, p);
  for (double a : {a_opt, 0.0}) {
    GerfOptions options;
    options.optimal_a = false;
    options.a = a;
    const GerfMap map = fit_gerf(options, MatrixD(x), MatrixD(y), 1.0, draws, false, make_random_key(6, "variance", 0));
    // M·φ_m(x)·φ_m(y): one feature's product, iid over m.
    const VectorD products = ((gerf_log_features<double>(map, MatrixD(x), 1.0, true) +
                               gerf_log_features<double>(map, MatrixD(y), 1.0, false))
                                  .transpose()
                                  .array()
                                  .exp() *
                              draws)
                                 .matrix()
                                 .col(0);
    const double mean = products.mean();
    const double variance = (products.array() - mean).square().sum() / (draws - 1);
    const double formula = oprf_feature_variance(a, x, y);
    const double target = std::exp(x.dot(y));
    const double z_mean = (mean - target) / std::sqrt(variance / draws);
    // Observed (‖x+y‖² = 1.33, A* = −0.0369): A*: variance 2.741 vs formula 2.713 (+1.0%), mean z = −0.03;
    // A = 0: 3.541 vs 3.446 (+2.8%), mean z = 1.05.
    INFO("A " << a << " |x+y|^2 " << z << " measured " << variance << " formula " << formula << " mean z " << z_mean);
    CHECK(std::abs(variance / formula - 1) < 0.05);
    CHECK(std::abs(z_mean) < 4);
  }
  CHECK(oprf_feature_variance(a_opt, x, y) < oprf_feature_variance(0.0, x, y));
}

TEST_CASE("A* minimises the pair-averaged log second moment, also where z/p is large", "[favorpp]") {
  for (const auto& [p, temperature] : {std::pair{16, 0.3}, std::pair{8, 0.05}, std::pair{64, 1.0}}) {
    const HeadView view = synth_slice(96, p, temperature, 2);
    const double root = std::sqrt(view.scale);
    const MatrixD q = root * view.q, k = root * view.k;
    const double z = mean_pair_sq_norm(q, k);
    // The pair mean computed the long way: mean over all (i, j) of ‖q_i + k_j‖². Observed gap 1e-15 relative.
    double direct = 0;
    for (int64_t i = 0; i < q.rows(); ++i)
      for (int64_t j = 0; j < k.rows(); ++j) direct += (q.row(i) + k.row(j)).squaredNorm();
    direct /= static_cast<double>(q.rows() * k.rows());
    CHECK(std::abs(direct - z) < 1e-10 * z);
    const double a = oprf_optimal_a(z, p);
    const double mq = q.rowwise().squaredNorm().mean(), mk = k.rowwise().squaredNorm().mean();
    const double at = oprf_mean_log_second_moment(a, z, mq, mk, p);
    const double below = oprf_mean_log_second_moment(a - 1e-3, z, mq, mk, p);
    const double above = oprf_mean_log_second_moment(a + 1e-3, z, mq, mk, p);
    // Observed (p, z/p, A*): (16, 0.46, −0.164), (8, 5.3, −1.43), (64, 0.035, −0.0163); both neighbours higher
    // (e.g. p = 64: 2.30034 at A*, 2.30079 at A* ± 1e-3).
    INFO("p " << p << " z/p " << z / p << " A* " << a << " L(A*) " << at << " L(A*-1e-3) " << below << " L(A*+1e-3) "
              << above);
    CHECK(a < 0);
    CHECK(at <= below);
    CHECK(at <= above);
    // The estimator fits this A (z from column statistics there, from the scaled matrices here: equal up
    // to rounding). Observed relative gap ≤ 4.7e-16.
    GerfMap map;
    favorpp_attention<float>(params_of("favorpp"), view, make_random_key(1, "fit", 0), &map);
    INFO("fitted A " << map.a << " gap " << std::abs(map.a - a) / std::abs(a));
    CHECK(std::abs(map.a - a) <= 1e-12 * std::abs(a));
  }
  CHECK(oprf_optimal_a(0.0, 8) == 0.0);
}

TEST_CASE("favorpp numerators and denominators are unbiased for every variant", "[favorpp][statistics]") {
  const HeadView view = synth_slice(24, 8, 0.5, 3, 5);
  const double root = std::sqrt(view.scale);
  const MatrixD q = root * view.q, k = root * view.k;
  MatrixD exact_logits = q * k.transpose();
  const MatrixD weights = exact_logits.array().exp();
  const VectorD d_true = weights.rowwise().sum();
  const MatrixD n_true = weights * view.v;
  const RandomStream signs(make_random_key(3, "signs", 0), Purpose::kGeneric);
  MatrixD w_n(n_true.rows(), n_true.cols());
  VectorD w_d(d_true.size());
  for (int64_t i = 0; i < w_n.size(); ++i) w_n.data()[i] = signs.uniform(0, static_cast<uint32_t>(i)) < 0.5 ? -1 : 1;
  for (int64_t i = 0; i < w_d.size(); ++i) w_d(i) = signs.uniform(1, static_cast<uint32_t>(i)) < 0.5 ? -1 : 1;
  const int seeds = 3000;
  for (const std::string spec : {"favorpp(M=16)", "favorpp(M=16,variant=arf)", "favorpp(M=16,variant=sderf)",
                                 "favorpp(M=16,variant=arf,arf_ref=1)", "favorpp(M=16,ortho=0,a=-0.05)"}) {
    // Statistics per seed: Σ_i D̂_i, Σ_i w_i·D̂_i and Σ_ic w_ic·N̂_ic (random signs catch cancelling biases).
    double sum[3] = {0, 0, 0}, sum2[3] = {0, 0, 0};
    const double target[3] = {d_true.sum(), w_d.dot(d_true), (w_n.array() * n_true.array()).sum()};
    for (int t = 0; t < seeds; ++t) {
      GerfMap map;
      favorpp_attention<double>(params_of(spec), view, make_random_key(9, spec, t), &map);
      const MatrixD fq = gerf_log_features<double>(map, q, 1.0, true).array().exp();
      const MatrixD fk = gerf_log_features<double>(map, k, 1.0, false).array().exp();
      const VectorD d_hat = fq * fk.colwise().sum().transpose();
      const MatrixD n_hat = fq * (fk.transpose() * view.v);
      const double stats[3] = {d_hat.sum(), w_d.dot(d_hat), (w_n.array() * n_hat.array()).sum()};
      for (int s = 0; s < 3; ++s) sum[s] += stats[s], sum2[s] += stats[s] * stats[s];
    }
    for (int s = 0; s < 3; ++s) {
      const double mean = sum[s] / seeds, var = (sum2[s] - seeds * mean * mean) / (seeds - 1);
      const double z = (mean - target[s]) / std::sqrt(var / seeds);
      // iid per seed, |z| < 4. Observed |z| ≤ 2.22 (sderf, Σ D̂) over all variants and statistics.
      INFO(spec << " statistic " << s << " mean " << mean << " target " << target[s] << " z " << z);
      CHECK(std::abs(z) < 4);
    }
  }
}

TEST_CASE("favorpp decodes its spec strictly", "[favorpp]") {
  CHECK(parse_spec("favorpp").canonical() == "favorpp(M=64,ortho=1,a=opt,variant=oprf,arf_ref=0,s=1)");
  CHECK(parse_spec("favorpp(a=-0.050)").canonical() == "favorpp(M=64,ortho=1,a=-0.05,variant=oprf,arf_ref=0,s=1)");
  CHECK(params_of("favorpp(a=-0.05)").gerf.a == -0.05);
  CHECK_FALSE(params_of("favorpp(a=-0.05)").gerf.optimal_a);
  CHECK(params_of("favorpp(variant=sderf)").gerf.variant == GerfVariant::kSderf);
  CHECK_THROWS_AS(params_of("favorpp(a=0.125)"), UsageError);
  CHECK_THROWS_AS(parse_spec("favorpp(a=abc)"), UsageError);
  CHECK_THROWS_AS(params_of("favorpp(s=0)"), UsageError);
  CHECK_THROWS_AS(params_of("favorpp(s=-1)"), UsageError);                  // a = opt
  CHECK_THROWS_AS(params_of("favorpp(s=-1,a=0,variant=arf)"), UsageError);  // not oprf
  CHECK(params_of("favorpp(s=-1,a=0)").gerf.sign == -1);
}

TEST_CASE("favorpp's trigonometric branch estimates the same kernel but is not positive", "[favorpp][statistics]") {
  // s = −1 with A = 0 is random Fourier features times e^{(‖x‖²+‖y‖²)/2}: unbiased for exp(x·y), but
  // feature products can be negative, which is why the estimator keeps to s = +1 by default.
  const auto [x, y] = fixed_pair(8, 0.3);
  const int seeds = 4000;
  for (double a : {0.0, -0.05}) {
    double sum = 0, sum2 = 0;
    int negative = 0;
    for (int t = 0; t < seeds; ++t) {
      GerfOptions options;
      options.optimal_a = false;
      options.a = a;
      options.sign = -1;
      const GerfMap map = fit_gerf(options, MatrixD(x), MatrixD(y), 1.0, 4, false, make_random_key(4, "trig", t));
      // Σ_m e^{2c_m + (‖x‖²+‖y‖²)/2}·cos(W_m·(x − y)): the real form of the complex features' product.
      double estimate = 0;
      for (int m = 0; m < 4; ++m)
        estimate += std::exp(2 * map.offsets(m) + 0.5 * (x.squaredNorm() + y.squaredNorm())) *
                    std::cos(map.projections.row(m).dot(x - y));
      negative += estimate < 0;
      sum += estimate;
      sum2 += estimate * estimate;
    }
    const double mean = sum / seeds, se = std::sqrt((sum2 / seeds - mean * mean) / (seeds - 1));
    const double z = (mean - std::exp(x.dot(y))) / se;
    // Observed: A = 0: z = −0.60, 178 of 4000 negative; A = −0.05: z = −0.28, 206 negative.
    INFO("A " << a << " z " << z << " negative " << negative);
    CHECK(std::abs(z) < 4);
    CHECK(negative > 0);
  }
  // The estimator with s = −1 runs and matches s=+1 in expectation only; here: finite on a mild slice.
  const HeadView view = synth_slice(64, 8, 1.0, 1);
  CHECK(run_estimator("favorpp(s=-1,a=0,M=256)", view).allFinite());
}

TEST_CASE("favorpp stays finite in float32 where one key shift per slice underflows", "[favorpp][shared]") {
  // stories260K (p = 8, peaked), layer 1 head 0: A* is very negative, A‖ω_m‖² spreads the key log-features
  // over ~100 nats, and under one slice-wide key shift (Performer's) whole feature columns underflow in
  // float32 and rows become 0/0. Shown with that evaluation first, then the estimator's per-feature shifts.
  const std::string path = shared_data("stories260K.h5");
  if (path.empty()) SKIP_TEST("../shared/data/stories260K.h5 is absent");
  const HeadView view = Dump::open(path).read_slice(1, 0, 0, 512);
  int old_zero = 0, bad = 0;
  GerfMap map;
  for (uint32_t trial = 0; trial < 8; ++trial) {
    const RandomKey key = make_random_key(11, "underflow", trial);
    const MatrixF out = favorpp_attention<float>(params_of("favorpp"), view, key, &map);
    bad += !out.allFinite();
    MatrixF estimate;  // the registered estimator's blocked pass (feature_attention.h)
    parse_spec("favorpp").make()->estimate(view, EstimateContext{key, nullptr}, estimate);
    bad += !estimate.allFinite();
    MatrixF lq = gerf_log_features<float>(map, view.qf, view.scale, true);
    MatrixF lk = gerf_log_features<float>(map, view.kf, view.scale, false);
    for (int64_t i = 0; i < lq.rows(); ++i) lq.row(i).array() = (lq.row(i).array() - lq.row(i).maxCoeff()).exp();
    lk = (lk.array() - lk.maxCoeff()).exp();
    const VectorF den = lq * lk.colwise().sum().transpose();
    old_zero += (den.array() == 0).count();
  }
  // Observed: A* = −6.81; one slice-wide shift: 340 zero denominators in 8 trials × 512 rows; the float32
  // formula and the estimator: no non-finite output.
  INFO("A* " << map.a << " zero denominators with one key shift " << old_zero << ", non-finite outputs " << bad);
  CHECK(old_zero > 0);
  CHECK(bad == 0);
}
