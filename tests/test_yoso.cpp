// YOSO against its own mathematics: the Gaussian hash's collision law, the Hadamard hash's
// (reported) bias, unbiasedness of YOSO-m for YOSO-E before normalisation, error falling with m,
// zero rows, and both table paths against a naive O(n²m) evaluation of the same codes.
#include <cmath>
#include <numbers>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/metrics/metrics.h"
#include "attnprobe/rng/random_matrix.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// Unit vectors u, w with u·w = cosine, in random directions (pair index `pair`).
MatrixD random_pair(double cosine, int p, uint32_t pair) {
  const RandomStream s(make_random_key(9, "pair", pair), Purpose::kGeneric);
  Eigen::VectorXd u(p), w(p);
  s.normals(0, 0, u.data(), p);
  s.normals(1, 0, w.data(), p);
  u.normalize();
  w -= w.dot(u) * u;
  w.normalize();
  MatrixD x(2, p);
  x.row(0) = u.transpose();
  x.row(1) = (cosine * u + std::sqrt(1 - cosine * cosine) * w).transpose();
  return x;
}

double collision_law(double cosine, int tau) { return std::pow(1 - std::acos(cosine) / std::numbers::pi, tau); }

// Independent float64 YOSO-E before normalisation: W·V with W from std::acos.
MatrixD yoso_e_unnormalized(const HeadView& view, int tau) {
  MatrixD w(view.n(), view.n());
  for (int64_t i = 0; i < view.n(); ++i)
    for (int64_t j = 0; j < view.n(); ++j) {
      const double c = view.q.row(i).normalized().dot(view.k.row(j).normalized());
      w(i, j) = std::pow(1 - std::acos(std::clamp(c, -1.0, 1.0)) / std::numbers::pi, tau);
    }
  return w * view.v;
}

}  // namespace

TEST_CASE("the Gaussian hash collides with probability (1 - theta/pi)^tau", "[yoso][statistics]") {
  // 8 vectors = 4 random pairs with cos θ = 0.3, 0.5, 0.7, 0.9, hashed by the same m functions.
  const int p = 64, m = 20000;
  const std::vector<double> cosines = {0.3, 0.5, 0.7, 0.9};
  MatrixD x(8, p);
  for (size_t c = 0; c < cosines.size(); ++c) x.middleRows(2 * c, 2) = random_pair(cosines[c], p, c);
  for (int tau : {4, 8}) {
    const auto codes = lsh_codes(x, m, tau, LshKind::kGauss, make_random_key(1, "collisions", tau));
    for (size_t c = 0; c < cosines.size(); ++c) {
      int64_t same = 0;
      for (int f = 0; f < m; ++f) same += codes[(2 * c) * m + f] == codes[(2 * c + 1) * m + f];
      const double law = collision_law(cosines[c], tau), freq = same / static_cast<double>(m);
      const double z = (freq - law) / std::sqrt(law * (1 - law) / m);
      // Binomial with m draws: |z| < 4. Observed (seed 1): |z| ≤ 2.23 over the 8 cases.
      INFO("cos " << cosines[c] << " tau " << tau << " law " << law << " freq " << freq << " z " << z);
      CHECK(std::abs(z) < 4);
    }
  }
}

TEST_CASE("the Hadamard hash collides less often than the Gaussian law (biased for yoso-e)", "[yoso][statistics]") {
  // Random pairs (a fresh pair and fresh sign diagonals per repetition): axis-aligned pairs are a
  // special case for a structured transform (e1 vs cos·e1 + sin·e2 even collides 1% MORE at
  // cos 0.9). Observed ratios freq/law at τ = 8 (1000 pairs × 1000 hashes): 0.892 (cos 0.3),
  // 0.930 (0.5), 0.964 (0.7), 0.989 (0.9), z = −13.8, −14.0, −11.7 for the first three — the
  // 1–11% deficit docs/estimators/yoso.md reports.
  const int p = 64, tau = 8, m = 1000, pairs = 1000;
  for (double cosine : {0.3, 0.5, 0.7, 0.9}) {
    int64_t same = 0;
    for (int pair = 0; pair < pairs; ++pair) {
      const auto codes =
          lsh_codes(random_pair(cosine, p, pair), m, tau, LshKind::kHadamard, make_random_key(10, "hadamard", pair));
      for (int f = 0; f < m; ++f) same += codes[f] == codes[m + f];
    }
    const double total = static_cast<double>(pairs) * m, law = collision_law(cosine, tau);
    const double ratio = same / total / law, z = (same / total - law) / std::sqrt(law * (1 - law) / total);
    INFO("cos " << cosine << " ratio " << ratio << " z " << z);
    CHECK(ratio < 1.0);
    if (cosine <= 0.7) CHECK(z < -4);  // significant deficit where it is large
  }
}

TEST_CASE("YOSO-m with Gaussian hashing is unbiased for YOSO-E before normalisation", "[yoso][statistics]") {
  for (int tau : {4, 8}) {
    const HeadView view = synth_slice(48, 16, 0.5, 0);
    const MatrixD target = yoso_e_unnormalized(view, tau);
    const int seeds = 3000;
    const std::string spec = fmt::format("yoso(m=4,tau={},hash=gauss,norm=none)", tau);
    double mean_error = 0;
    const auto z = weighted_z_scores(spec, view, target, seeds, &mean_error);
    for (int w = 0; w < 4; ++w) {
      // Observed (tau 4): z = −0.62, 0.82, −0.46, 1.08; (tau 8): −0.03, −0.14, −1.06, −0.21.
      INFO("tau " << tau << " weighting " << w << " z " << z[w]);
      CHECK(std::abs(z[w]) < 4);
    }
    // And the mean itself approaches the target (relative Frobenius error shrinking like 1/√seeds;
    // observed 0.009 at tau 4, 0.012 at tau 8 after 3000 seeds).
    INFO("tau " << tau << " mean error " << mean_error);
    CHECK(mean_error < 0.15);
  }
}

TEST_CASE("YOSO-m's mean angle to YOSO-E falls as m grows", "[yoso][statistics]") {
  const HeadView view = synth_slice(256, 32, 0.3, 1);
  const MatrixD reference = *parse_spec("yoso-e(tau=8)").make()->reference(view, nullptr);
  const ReferenceNorms norms = reference_norms(reference);
  std::vector<double> angles;
  for (int m : {8, 32, 128}) {
    double total = 0;
    const int trials = 8;
    for (int t = 0; t < trials; ++t)
      total += compute_metrics(reference, norms, run_estimator(fmt::format("yoso(m={},tau=8)", m), view, t),
                               {Metric::kAngle})[0];
    angles.push_back(total / trials);
  }
  // Observed: 0.162, 0.087, 0.046 rad — halving per 4× hashes (angle ∝ 1/√m).
  INFO("angles " << angles[0] << " " << angles[1] << " " << angles[2]);
  CHECK(angles[1] < 0.7 * angles[0]);
  CHECK(angles[2] < 0.7 * angles[1]);
}

TEST_CASE("both table paths equal a naive evaluation of the same codes", "[yoso]") {
  const HeadView view = synth_slice(64, 16, 0.5, 2);
  for (int tau : {4, 14}) {  // 2^4 buckets: dense table; 2^14 > max(4096, 8n): sorted lookup
    const int m = 6;
    const RandomKey key = make_random_key(8, fmt::format("yoso(m={},tau={},hash=gauss,norm=none)", m, tau), 0);
    const auto qc = lsh_codes(normalize_rows(view.q), m, tau, LshKind::kGauss, key);
    const auto kc = lsh_codes(normalize_rows(view.k), m, tau, LshKind::kGauss, key);
    MatrixD naive = MatrixD::Zero(view.n(), view.pv());
    for (int64_t i = 0; i < view.n(); ++i)
      for (int f = 0; f < m; ++f)
        for (int64_t j = 0; j < view.n(); ++j)
          if (qc[i * m + f] == kc[j * m + f]) naive.row(i) += view.v.row(j) / m;
    const MatrixF out = run_estimator(fmt::format("yoso(m={},tau={},hash=gauss,norm=none)", m, tau), view, 0);
    const double err = (out.cast<double>() - naive).norm() / std::max(1.0, naive.norm());
    // float32 tables and output against float64 sums: ~1e-7 relative. Observed: 6.5e-8 (dense), 4.5e-8 (sorted).
    INFO("tau " << tau << " relative error " << err);
    CHECK(err <= 1e-6);
  }
}

TEST_CASE("queries that collide with no key give zero rows and are counted", "[yoso]") {
  const HeadView view = synth_slice(64, 16, 2.0, 3);
  const int m = 2, tau = 16;
  const std::string spec = fmt::format("yoso(m={},tau={},hash=gauss,norm=l2)", m, tau);
  const RandomKey key = make_random_key(8, spec, 0);
  const auto qc = lsh_codes(normalize_rows(view.q), m, tau, LshKind::kGauss, key);
  const auto kc = lsh_codes(normalize_rows(view.k), m, tau, LshKind::kGauss, key);
  const MatrixF out = run_estimator(spec, view, 0);
  int64_t lonely = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    bool hit = false;
    for (int f = 0; f < m && !hit; ++f)
      for (int64_t j = 0; j < view.n() && !hit; ++j) hit = qc[i * m + f] == kc[j * m + f];
    lonely += !hit;
    CHECK((out.row(i).squaredNorm() == 0) == !hit);
  }
  REQUIRE(lonely > 0);  // 16 bits on diffuse data: most queries find no key (observed 41 of 64)
  const MatrixD reference = *parse_spec("yoso-e(tau=16)").make()->reference(view, nullptr);
  const double zero_rows = compute_metrics(reference, reference_norms(reference), out, {Metric::kZeroRows})[0];
  CHECK(zero_rows == Approx(lonely / 64.0));
  CHECK(out.allFinite());
}

TEST_CASE("yoso-e has no NaN when q equals k and matches its float64 reference", "[yoso]") {
  HeadView view = synth_slice(200, 32, 0.2, 4);
  view = make_head_view(view.id, view.scale, view.q, view.q, view.v);  // q̂·q̂ rounds above 1 in float32
  const auto estimator = parse_spec("yoso-e(tau=8)").make();
  MatrixF out;
  estimator->estimate(view, EstimateContext{}, out);
  const MatrixD ref = *estimator->reference(view, nullptr);
  CHECK(out.allFinite());
  CHECK(ref.allFinite());
  // At q = k the cosine is 1, where d(acos)/dc → ∞: a float32 rounding of 6e-8 in the cosine gives
  // acos ≈ sqrt(2·6e-8) = 3.5e-4, i.e. a weight off by τ·3.5e-4/π ≈ 9e-4 relative on the dominant
  // diagonal term. Bound 1e-3; observed 5.4e-5 relative (the float64 reference has no such error).
  CHECK((ref - out.cast<double>()).norm() < 1e-3 * ref.norm());
}

TEST_CASE("the fast Walsh-Hadamard transform equals the Sylvester matrix product", "[yoso]") {
  const int n = 8;
  MatrixD h(1, 1);
  h << 1;
  while (h.rows() < n) {
    MatrixD next(2 * h.rows(), 2 * h.rows());
    next << h, h, h, -h;
    h = next;
  }
  Eigen::VectorXd x(n);
  x << 0.5, -1, 2, 3, 0.25, -4, 1, 7;
  Eigen::VectorXd y = x;
  fast_walsh_hadamard(y.data(), n);
  CHECK((y - h * x).norm() < 1e-12);
}

TEST_CASE("hadamard hashing pads p to a power of two and rejects tau beyond it", "[yoso]") {
  const HeadView view = synth_slice(32, 50, 0.5, 5);  // p = 50 -> padded to 64
  const MatrixF out = run_estimator("yoso(m=16,tau=8,hash=hadamard)", view, 0);
  CHECK(out.allFinite());
  const HeadView narrow = synth_slice(16, 12, 0.5, 5);  // p = 12 -> padded to 16
  CHECK_THROWS_WITH(lsh_codes(normalize_rows(narrow.q), 4, 20, LshKind::kHadamard, RandomKey{1}),
                    Catch::Contains("exceeds the padded head dim 16"));
}

TEST_CASE("input=lift gives unit rows with q.k / M^2 inner products", "[yoso][lift]") {
  HeadView view = synth_slice(40, 16, 0.5, 11);
  // Rows of very different norms (so M is set by one row and the others keep their lengths).
  MatrixD q = view.q, k = view.k;
  for (int64_t i = 0; i < q.rows(); ++i) {
    q.row(i) *= 0.1 + 0.05 * i;
    k.row(i) *= 2.0 - 0.03 * i;
  }
  MatrixD q_hat, k_hat;
  yoso_inputs(q, k, true, q_hat, k_hat);
  REQUIRE(q_hat.cols() == 18);
  REQUIRE(k_hat.cols() == 18);
  const double big = std::max(q.rowwise().norm().maxCoeff(), k.rowwise().norm().maxCoeff());
  const double norm_error = std::max((q_hat.rowwise().norm().array() - 1).abs().maxCoeff(),
                                     (k_hat.rowwise().norm().array() - 1).abs().maxCoeff());
  const double product_error = (q_hat * k_hat.transpose() - q * k.transpose() / (big * big)).cwiseAbs().maxCoeff();
  // float64 rounding: a few ulps. Observed (seed 11): 1.1e-16 and 2.2e-16.
  INFO("max | |x^| - 1 | " << norm_error << "  max |q^.k^ - q.k/M^2| " << product_error);
  CHECK(norm_error < 1e-14);
  CHECK(product_error < 1e-14);
  // The l2 input is the plain normalisation, p unchanged.
  yoso_inputs(q, k, false, q_hat, k_hat);
  CHECK(q_hat.cols() == 16);
  CHECK((q_hat - normalize_rows(q)).norm() == 0);
}

TEST_CASE("lifted YOSO-m with Gaussian hashing is unbiased for lifted YOSO-E before normalisation",
          "[yoso][lift][statistics]") {
  const HeadView view = synth_slice(48, 16, 0.5, 0);
  MatrixD q_hat, k_hat;
  yoso_inputs(view.q, view.k, true, q_hat, k_hat);
  const int tau = 4;
  MatrixD w(view.n(), view.n());
  for (int64_t i = 0; i < view.n(); ++i)
    for (int64_t j = 0; j < view.n(); ++j)
      w(i, j) = collision_law(std::clamp(q_hat.row(i).dot(k_hat.row(j)), -1.0, 1.0), tau);
  const MatrixD target = w * view.v;
  double mean_error = 0;
  const auto z = weighted_z_scores("yoso(m=4,tau=4,hash=gauss,norm=none,input=lift)", view, target, 3000, &mean_error);
  for (int s = 0; s < 4; ++s) {
    // Observed (seed 8): z = 1.34, −0.54, −0.06, 0.54.
    INFO("weighting " << s << " z " << z[s]);
    CHECK(std::abs(z[s]) < 4);
  }
  // Observed mean error 0.0104 after 3000 seeds.
  INFO("mean error " << mean_error);
  CHECK(mean_error < 0.15);
  // And yoso-e(input=lift) itself is ℓ2(W·V) of the lifted rows.
  const MatrixD e = *parse_spec("yoso-e(tau=4,input=lift)").make()->reference(view, nullptr);
  CHECK((e - normalize_rows(target)).norm() < 1e-12 * e.norm());
}

TEST_CASE("input=lift differs from input=l2 and hashes in p + 2 dimensions (hadamard pads)", "[yoso][lift]") {
  const HeadView view = synth_slice(32, 16, 0.5, 12);  // p + 2 = 18 -> hadamard pads to 32
  const MatrixF lifted = run_estimator("yoso(m=16,tau=8,hash=hadamard,input=lift)", view, 0);
  const MatrixF plain = run_estimator("yoso(m=16,tau=8,hash=hadamard,input=l2)", view, 0);
  CHECK(lifted.allFinite());
  CHECK((lifted - plain).norm() > 0);
  // τ = 20 fits the lifted dims' padding (32) though not p = 16's.
  CHECK(run_estimator("yoso(m=4,tau=20,hash=hadamard,input=lift)", view, 0).allFinite());
}

TEST_CASE("yoso gives the same bits on 1 and 2 threads inside one call", "[yoso]") {
  // Hashing runs in row blocks (gauss) or rows (hadamard) on the call's pool and queries read the
  // tables in row blocks: each row's codes and sums depend on that row and the draws alone.
  const HeadView view = synth_slice(700, 16, 0.3, 21);
  for (const std::string spec : {"yoso(m=8)", "yoso(m=8,hash=hadamard)", "yoso(m=8,tau=20)"}) {
    INFO(spec);
    const PooledEstimates runs = estimate_with_pools(spec, view, make_random_key(5, spec, 0));
    CHECK(runs.one_thread == runs.two_threads);
    CHECK(runs.one_thread == runs.alone);
  }
}

TEST_CASE("Gaussian codes are the signs of the float64 projections, also within float32's rounding of 0", "[yoso]") {
  // The projections run in float32 and those near 0 are taken again in float64 (lsh.cpp). Rows built to
  // lie 1e-9·‖r_j‖² off the hyperplane of one drawn r_j (float32's own error there is ~1e-6) must still
  // get the float64 sign, on both sides; the other rows are ordinary. Reference: signs of X·Rᵀ in float64.
  // m·τ = 15 (one partial 16-lane group), 63, 65 and 90 (codes whose bits straddle two 64-bit words of the
  // packed signs: τ = 13 at bit 52, τ = 30 at bit 60).
  const int p = 24;
  for (const auto& [m, tau] : {std::pair{3, 5}, std::pair{9, 7}, std::pair{5, 13}, std::pair{3, 30}}) {
    INFO("m = " << m << ", tau = " << tau);
    const RandomKey key = make_random_key(4, "near-zero", 0);
    const MatrixD r = normal_rows(RandomStream(key, Purpose::kHashProjection), m * tau, p);
    MatrixD x = synth_slice(40, p, 1.0, 9).q;
    for (int64_t i = 0; i < 30; ++i) {
      const int64_t j = (7 * i) % (m * tau);
      const double offset = (i % 2 == 0 ? 1e-9 : -1e-9) * r.row(j).squaredNorm();
      x.row(i) -= (x.row(i).dot(r.row(j)) / r.row(j).squaredNorm()) * r.row(j);  // onto the hyperplane…
      x.row(i) += (offset / r.row(j).squaredNorm()) * r.row(j);                  // …and just off it
    }
    const std::vector<uint32_t> codes = lsh_codes(x, m, tau, LshKind::kGauss, key, nullptr);
    const MatrixD projections = x * r.transpose();
    for (int64_t i = 0; i < x.rows(); ++i)
      for (int f = 0; f < m; ++f) {
        uint32_t expected = 0;
        for (int b = 0; b < tau; ++b) expected |= static_cast<uint32_t>(projections(i, f * tau + b) > 0) << b;
        CHECK(codes[i * m + f] == expected);
      }
    int near = 0;
    for (int64_t i = 0; i < 30; ++i) {
      const int64_t j = (7 * i) % (m * tau);
      near += std::abs(projections(i, j)) < 1e-6 * r.row(j).norm();
    }
    CHECK(near == 30);  // the constructed rows really are within float32's rounding of the hyperplane
  }
}
