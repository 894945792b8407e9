// Metrics on closed-form cases (docs/metrics.md).
#include <Eigen/SVD>
#include <cmath>
#include <limits>
#include <numbers>

#include "attnprobe/metrics/metrics.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {
double metric(const MatrixD& ref, const MatrixF& est, Metric m) {
  return compute_metrics(ref, reference_norms(ref), est, {m})[0];
}
}  // namespace

TEST_CASE("spectral norm of known matrices", "[metrics]") {
  MatrixD diag = MatrixD::Zero(5, 3);
  diag(0, 0) = 2;
  diag(1, 1) = -7;
  diag(2, 2) = 3;
  CHECK(spectral_norm(diag) == Approx(7.0).epsilon(1e-14));
  // Rank one u·vᵀ has ‖·‖₂ = ‖u‖·‖v‖ = 3 · 5 (u = (1,2,2), v = (3,4)).
  Eigen::Vector3d u(1, 2, 2);
  Eigen::Vector2d v(3, 4);
  CHECK(spectral_norm(MatrixD(u * v.transpose())) == Approx(15.0).epsilon(1e-14));
  CHECK(spectral_norm(MatrixD(v * u.transpose())) == Approx(15.0).epsilon(1e-14));  // wide: uses A·Aᵀ
  // Against an SVD on an arbitrary matrix.
  MatrixD a(6, 4);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) a(i, j) = std::sin(1.0 + 3 * i + j) * (j + 1);
  Eigen::JacobiSVD<MatrixD> svd(a);
  CHECK(spectral_norm(a) == Approx(svd.singularValues()(0)).epsilon(1e-12));
  CHECK(spectral_norm(MatrixD::Zero(4, 2)) == 0.0);
}

TEST_CASE("Frobenius and MSE and NMSE and max-abs on a closed-form difference", "[metrics]") {
  MatrixD ref(2, 2);
  ref << 1, 0, 0, 1;
  MatrixF est(2, 2);
  est << 1, 0, 0, -1;  // difference: (0,0;0,2)
  const ReferenceNorms norms = reference_norms(ref);
  const auto values = compute_metrics(ref, norms, est, all_metrics());
  CHECK(values[0] == Approx(2.0));                   // spec
  CHECK(values[1] == Approx(2.0));                   // spec_rel: ‖I‖₂ = 1
  CHECK(values[2] == Approx(2.0));                   // fro
  CHECK(values[3] == Approx(2.0 / std::sqrt(2.0)));  // fro_rel
  CHECK(values[4] == Approx(4.0 / 4.0));             // mse = 4 / (n·p)
  CHECK(values[5] == Approx(4.0 / 2.0));             // nmse = 4 / ‖I‖_F²
  CHECK(values[6] == Approx(2.0));                   // maxabs
  CHECK(values[7] == Approx(std::numbers::pi / 2));  // angle: rows (0,1) vs (0,-1) → π, (1,0) vs (1,0) → 0
  CHECK(values[8] == 0.0);                           // zero_rows
}

TEST_CASE("angle counts zero rows as pi/2 and reports their fraction", "[metrics]") {
  MatrixD ref(4, 2);
  ref << 1, 0, 0, 2, 3, 3, 0, 0;
  MatrixF est(4, 2);
  est << 2, 0, 0, 0, -1, -1, 0, 0;  // same direction; zero estimate; opposite; both zero
  // Angles: 0, π/2 (zero), π, π/2 (zero) → mean π/2; zero rows: 2 of 4.
  CHECK(metric(ref, est, Metric::kAngle) == Approx(std::numbers::pi / 2));
  CHECK(metric(ref, est, Metric::kZeroRows) == Approx(0.5));
}

TEST_CASE("angle of nearly parallel rows is finite", "[metrics]") {
  // The arccos form needed its cosine clamped to [-1, 1] here; the atan2 form has no domain to leave.
  MatrixD ref(1, 3);
  ref << 0.1, 0.2, 0.3;
  MatrixF est = ref.cast<float>();
  const double angle = metric(ref, est, Metric::kAngle);
  INFO("angle " << angle);
  CHECK(std::isfinite(angle));
  CHECK(angle < 1e-3);  // float32 rounding of the estimate: observed 1.19e-8
}

TEST_CASE("angle is exact for identical rows and keeps its precision near 0 and pi", "[metrics]") {
  // arccos(â·b̂) holds θ² only to 1.1e-16 near θ = 0: it gave 0.988e-7 for the 1e-7 angle (1.2% off),
  // π − 1.01e-7 for the one near π, and 2.1e-8 for identical rows. The atan2 form is good to a few ulps.
  const double tiny = std::atan(static_cast<double>(1e-7f));
  MatrixD ref(3, 2);
  ref << 1, 0, 1, 0, 0.5, 0.25;
  MatrixF est(3, 2);
  est << 1, 1e-7f, -1, 1e-7f, 0.5f, 0.25f;
  const std::vector<double> each = {tiny, std::numbers::pi - tiny, 0.0};
  for (int64_t row = 0; row < 3; ++row) {
    INFO("row " << row);
    CHECK(metric(ref.middleRows(row, 1), est.middleRows(row, 1), Metric::kAngle) ==
          Approx(each[row]).epsilon(1e-12).margin(0));  // row 2: exactly 0 (no margin, relative to 0)
  }
}

TEST_CASE("relative metrics are NaN when the reference is zero", "[metrics]") {
  MatrixD ref = MatrixD::Zero(3, 2);
  MatrixF est = MatrixF::Ones(3, 2);
  CHECK(std::isnan(metric(ref, est, Metric::kSpecRel)));
  CHECK(std::isnan(metric(ref, est, Metric::kNmse)));
  CHECK(metric(ref, est, Metric::kFro) == Approx(std::sqrt(6.0)));
}

TEST_CASE("a NaN or an infinity in the estimate is never a small error", "[metrics]") {
  // The spectral norm went through a symmetric eigensolver, whose NaN eigenvalues max(0, ·) turned into
  // 0; maxCoeff skipped a NaN that was not first. Both reported a broken estimate as (nearly) exact.
  MatrixD ref(3, 2);
  ref << 1, 2, 3, 4, 5, 6;
  MatrixF with_nan = ref.cast<float>(), with_inf = ref.cast<float>();
  with_nan(1, 1) = std::numeric_limits<float>::quiet_NaN();
  with_inf(2, 0) = std::numeric_limits<float>::infinity();
  for (Metric m : {Metric::kSpec, Metric::kSpecRel, Metric::kFro, Metric::kMaxAbs, Metric::kAngle}) {
    INFO(metric_name(m));
    CHECK(std::isnan(metric(ref, with_nan, m)));
  }
  CHECK(metric(ref, with_inf, Metric::kSpec) == HUGE_VAL);
  CHECK(metric(ref, with_inf, Metric::kMaxAbs) == HUGE_VAL);
  // Finite entries whose squares overflow (the Gram matrix): still the right norm, as in the tiny range
  // (observed relative differences 0 and 2.2e-16).
  CHECK(spectral_norm(MatrixD(1e300 * ref)) / 1e300 == Approx(spectral_norm(ref)).epsilon(1e-12));
  CHECK(spectral_norm(MatrixD(1e-300 * ref)) / 1e-300 == Approx(spectral_norm(ref)).epsilon(1e-12));
}

TEST_CASE("metric names parse strictly", "[metrics]") {
  CHECK(parse_metrics("all").size() == 9);
  CHECK(parse_metrics("angle,spec").size() == 2);
  CHECK_THROWS_WITH(parse_metrics("angle,specc"), Catch::Contains("unknown metric 'specc'"));
}
