#include "attnprobe/metrics/metrics.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>

namespace attnprobe {

namespace {

// The angle between two nonzero rows given their norms: 2·atan2(‖â − b̂‖, ‖â + b̂‖) on the unit rows, the
// same angle as arccos(â·b̂) without its loss near 0 and π, where cos θ = 1 − θ²/2 holds θ² only to
// 1.1e-16: with arccos an angle of 1e-7 (an estimate within float32 rounding of the reference) came out
// 1.2% off, and identical rows 2e-8 instead of 0 (tests/test_metrics.cpp). Here both keep a few ulps.
// The divisions stay: with reciprocals taken once (1.24 → 0.74 ms for 16384 rows of 64; arccos 0.49) the
// compiler fuses a·x − b·y into one FMA, and identical rows no longer give exactly 0.
template <class RowA, class RowB>
double angle_between(const RowA& a, double norm_a, const RowB& b, double norm_b) {
  return 2.0 * std::atan2((a / norm_a - b / norm_b).norm(), (a / norm_a + b / norm_b).norm());
}

// Whether `m` holds a NaN: its sum is NaN then, and a vectorised sum costs ~20 µs at 4096 × 64 where
// Eigen's hasNaN()/allFinite() take ~260 µs (element by element), a quarter of the spectral norm.
bool has_nan(const MatrixD& m) { return std::isnan(m.sum()) && m.hasNaN(); }

}  // namespace

double spectral_norm(const MatrixD& a) {
  if (a.size() == 0) return 0;
  // A NaN or an infinity would go through the eigensolver as NaN, and max(0, NaN) is 0: a broken
  // estimate would score a perfect spectral error.
  if (has_nan(a)) return std::numeric_limits<double>::quiet_NaN();
  const double largest = a.cwiseAbs().maxCoeff();  // exact once there is no NaN
  if (std::isinf(largest)) return HUGE_VAL;
  const auto norm_of = [](const MatrixD& m) {
    const MatrixD gram = m.rows() >= m.cols() ? MatrixD(m.transpose() * m) : MatrixD(m * m.transpose());
    Eigen::SelfAdjointEigenSolver<MatrixD> solver(gram, Eigen::EigenvaluesOnly);
    return std::sqrt(std::max(0.0, solver.eigenvalues().maxCoeff()));
  };
  if (largest == 0) return 0;
  if (largest > 1e-100 && largest < 1e100) return norm_of(a);  // the Gram matrix's entries stay normal
  // Beyond, the Gram matrix would overflow (entries past ~1e154) or underflow: the matrix is scaled by a
  // power of two first (exact) and the norm scaled back. The common range above keeps its copy-free path.
  int exponent = 0;
  std::frexp(largest, &exponent);
  return std::ldexp(norm_of(std::ldexp(1.0, -exponent) * a), exponent);
}

ReferenceNorms reference_norms(const MatrixD& reference) {
  return ReferenceNorms{spectral_norm(reference), reference.norm()};
}

std::vector<double> compute_metrics(const MatrixD& reference, const ReferenceNorms& norms, const MatrixF& estimate,
                                    const std::vector<Metric>& which) {
  const MatrixD est = estimate.cast<double>();
  const MatrixD diff = reference - est;
  const double n = static_cast<double>(reference.rows()), p = static_cast<double>(reference.cols());
  const double fro2 = diff.squaredNorm();
  const double nan = std::numeric_limits<double>::quiet_NaN();

  // Per-row angles; a row where either side is the zero vector counts π/2 and as a zero row.
  double angle_sum = 0;
  int64_t zero_rows = 0;
  const bool need_angles =
      std::any_of(which.begin(), which.end(), [](Metric m) { return m == Metric::kAngle || m == Metric::kZeroRows; });
  if (need_angles) {
    for (int64_t i = 0; i < reference.rows(); ++i) {
      const double nr = reference.row(i).norm(), ne = est.row(i).norm();
      if (nr == 0 || ne == 0) {
        angle_sum += std::numbers::pi / 2;
        ++zero_rows;
        continue;
      }
      angle_sum += angle_between(reference.row(i), nr, est.row(i), ne);
    }
  }

  double spec = -1;  // computed at most once
  auto spec_value = [&] { return spec >= 0 ? spec : (spec = spectral_norm(diff)); };
  std::vector<double> values;
  values.reserve(which.size());
  for (Metric m : which) {
    switch (m) {
      case Metric::kSpec:
        values.push_back(spec_value());
        break;
      case Metric::kSpecRel:
        values.push_back(norms.spec > 0 ? spec_value() / norms.spec : nan);
        break;
      case Metric::kFro:
        values.push_back(std::sqrt(fro2));
        break;
      case Metric::kFroRel:
        values.push_back(norms.fro > 0 ? std::sqrt(fro2) / norms.fro : nan);
        break;
      case Metric::kMse:
        values.push_back(fro2 / (n * p));
        break;
      case Metric::kNmse:
        values.push_back(norms.fro > 0 ? fro2 / (norms.fro * norms.fro) : nan);
        break;
      case Metric::kMaxAbs:
        // maxCoeff skips a NaN unless it comes first: a NaN anywhere makes the largest error NaN.
        values.push_back(diff.size() == 0 ? 0.0 : has_nan(diff) ? nan : diff.cwiseAbs().maxCoeff());
        break;
      case Metric::kAngle:
        values.push_back(angle_sum / n);
        break;
      case Metric::kZeroRows:
        values.push_back(static_cast<double>(zero_rows) / n);
        break;
      case Metric::kGradQFroRel:
      case Metric::kGradQAngle:
      case Metric::kGradVFroRel:
      case Metric::kGradPairs:
        values.push_back(nan);  // set_gradient_metrics
        break;
      case Metric::kBiasFroRel:
      case Metric::kVarFroRel:
      case Metric::kBiasSpecRel:
      case Metric::kRowTv:
      case Metric::kRowKl:
      case Metric::kTopkRecall:
      case Metric::kKeysAttended:
      case Metric::kKeysScored:
      case Metric::kRepsAttended:
      case Metric::kDensity:
      case Metric::kDensityScored:
      case Metric::kMassRecall:
      case Metric::kTailMass:
      case Metric::kTailGap:
      case Metric::kTailPred:
      case Metric::kRowKlRev:
      case Metric::kKeptOverlap:
      case Metric::kTopkRecallAtK:
      case Metric::kDenRel:
      case Metric::kNumRel:
      case Metric::kEpsCover:
      case Metric::kPilot:
      case Metric::kApproxErr:
      case Metric::kRoundFloor:
      case Metric::kRoundExcess:
      case Metric::kFaRatio:
      case Metric::kApproxErrSpec:
      case Metric::kRoundFloorSpec:
      case Metric::kRoundExcessSpec:
      case Metric::kFaRatioSpec:
      case Metric::kNonfiniteRows:
      case Metric::kKeptOverlapF32:
      case Metric::kScoreTies:
      case Metric::kCutTies:
      case Metric::kKeptOverlapA:
        throw std::logic_error("a case-level, weight, selection or precision metric asked of compute_metrics");
    }
  }
  return values;
}

void CaseAccumulator::add(const MatrixF& estimate) {
  const MatrixD x = estimate.cast<double>();
  if (count_ == 0) {
    mean_ = x;
    m2_ = MatrixD::Zero(x.rows(), x.cols());
    count_ = 1;
    return;
  }
  ++count_;
  const MatrixD delta = x - mean_;
  mean_ += delta / static_cast<double>(count_);
  m2_.array() += delta.array() * (x - mean_).array();
}

std::vector<double> CaseAccumulator::metrics(const MatrixD& reference, const ReferenceNorms& norms,
                                             const std::vector<Metric>& which) const {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> values;
  for (Metric m : which) {
    if (count_ < 2) {  // a bias and a spread need two trials
      values.push_back(nan);
      continue;
    }
    switch (m) {
      case Metric::kBiasFroRel:
        values.push_back(norms.fro > 0 ? (mean_ - reference).norm() / norms.fro : nan);
        break;
      case Metric::kVarFroRel:
        values.push_back(norms.fro > 0 ? m2_.sum() / (count_ - 1) / (norms.fro * norms.fro) : nan);
        break;
      case Metric::kBiasSpecRel:
        values.push_back(norms.spec > 0 ? spectral_norm(mean_ - reference) / norms.spec : nan);
        break;
      default:
        throw std::logic_error("a per-trial metric asked of a case");
    }
  }
  return values;
}

namespace {

// Over the rows where the reference gradient is nonzero: a zero reference row has no direction to
// compare with (a causal row 0, whose one key takes weight 1 whatever q_0 is, has ∇_Q row 0 = 0 for
// every estimator and counted π/2 against all of them). An estimate's zero row against a nonzero one
// counts π/2, as in `angle`. NaN when every reference row is zero. Norms by stableNorm and the angle of
// unit rows: an upstream G of 1e160 (a dump's dy) overflowed the squared norms to NaN, one of 1e-200
// underflowed them to 0, and the metrics do not depend on G's scale.
double mean_row_angle(const MatrixD& reference, const MatrixD& estimate) {
  double total = 0;
  int64_t rows = 0;
  for (int64_t i = 0; i < reference.rows(); ++i) {
    const double nr = reference.row(i).stableNorm(), ne = estimate.row(i).stableNorm();
    if (nr == 0) continue;
    ++rows;
    total += ne == 0 ? std::numbers::pi / 2 : angle_between(reference.row(i), nr, estimate.row(i), ne);
  }
  return rows > 0 ? total / static_cast<double>(rows) : std::numeric_limits<double>::quiet_NaN();
}

double relative_fro(const MatrixD& reference, const MatrixD& estimate) {
  const double norm = reference.stableNorm();
  return norm > 0 ? (estimate - reference).stableNorm() / norm : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

void set_gradient_metrics(const Gradients* reference, const Gradients* estimate, const std::vector<Metric>& which,
                          std::vector<double>& values) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const bool comparable = reference && estimate && reference->q.rows() == estimate->q.rows() &&
                          reference->q.cols() == estimate->q.cols() && reference->v.rows() == estimate->v.rows() &&
                          reference->v.cols() == estimate->v.cols();
  for (size_t m = 0; m < which.size(); ++m) {
    switch (which[m]) {
      case Metric::kGradQFroRel:
        values[m] = comparable ? relative_fro(reference->q, estimate->q) : nan;
        break;
      case Metric::kGradQAngle:
        values[m] = comparable ? mean_row_angle(reference->q, estimate->q) : nan;
        break;
      case Metric::kGradVFroRel:
        values[m] = comparable ? relative_fro(reference->v, estimate->v) : nan;
        break;
      case Metric::kGradPairs:
        values[m] = estimate ? estimate->pair_fraction : nan;
        break;
      default:
        break;
    }
  }
}

std::vector<double> precision_metrics(const MatrixD& reference, const ReferenceNorms& norms, const RoundingParts& parts,
                                      const std::vector<Metric>& which) {
  const MatrixD plain = parts.float32_estimate.cast<double>();
  const MatrixD rounded = parts.rounded_estimate.cast<double>();
  const MatrixD exact = parts.rounded_exact.cast<double>();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // ‖a − b‖ in either norm; NaN or inf when a side is not finite (f16 overflow), never an exception.
  const auto fro = [](const MatrixD& a, const MatrixD& b) { return (a - b).norm(); };
  const auto spec = [](const MatrixD& a, const MatrixD& b) { return spectral_norm(a - b); };
  const auto over = [nan](double value, double norm) { return norm > 0 ? value / norm : nan; };
  std::vector<double> values;
  values.reserve(which.size());
  for (Metric m : which) {
    switch (m) {
      case Metric::kApproxErr:
        values.push_back(over(fro(plain, reference), norms.fro));
        break;
      case Metric::kRoundFloor:
        values.push_back(over(fro(exact, reference), norms.fro));
        break;
      case Metric::kRoundExcess:
        values.push_back(over(fro(rounded, plain), norms.fro));
        break;
      case Metric::kFaRatio:  // 0/0 (an exact floor and an exact estimate) is NaN: there is no ratio
        values.push_back(fro(rounded, reference) / fro(exact, reference));
        break;
      case Metric::kApproxErrSpec:
        values.push_back(over(spec(plain, reference), norms.spec));
        break;
      case Metric::kRoundFloorSpec:
        values.push_back(over(spec(exact, reference), norms.spec));
        break;
      case Metric::kRoundExcessSpec:
        values.push_back(over(spec(rounded, plain), norms.spec));
        break;
      case Metric::kFaRatioSpec:
        values.push_back(spec(rounded, reference) / spec(exact, reference));
        break;
      case Metric::kNonfiniteRows: {
        int64_t rows = 0;
        for (int64_t i = 0; i < rounded.rows(); ++i) rows += rounded.row(i).allFinite() ? 0 : 1;
        values.push_back(rounded.rows() > 0 ? static_cast<double>(rows) / static_cast<double>(rounded.rows()) : 0.0);
        break;
      }
      default:
        throw std::logic_error(std::string("not a precision metric: ") + metric_name(m));
    }
  }
  return values;
}

}  // namespace attnprobe
