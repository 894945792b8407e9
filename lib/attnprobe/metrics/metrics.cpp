#include "attnprobe/metrics/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

const std::vector<Metric>& all_metrics() {
  static const std::vector<Metric> kAll = {Metric::kSpec,   Metric::kSpecRel, Metric::kFro,
                                           Metric::kFroRel, Metric::kMse,     Metric::kNmse,
                                           Metric::kMaxAbs, Metric::kAngle,   Metric::kZeroRows};
  return kAll;
}

const std::vector<Metric>& known_metrics() {
  static const std::vector<Metric> kKnown = [] {
    std::vector<Metric> out = all_metrics();
    for (Metric m : {Metric::kGradQFroRel, Metric::kGradQAngle, Metric::kGradVFroRel, Metric::kGradPairs})
      out.push_back(m);
    return out;
  }();
  return kKnown;
}

bool is_gradient_metric(Metric metric) {
  return metric == Metric::kGradQFroRel || metric == Metric::kGradQAngle || metric == Metric::kGradVFroRel ||
         metric == Metric::kGradPairs;
}

const char* metric_name(Metric metric) {
  switch (metric) {
    case Metric::kSpec:
      return "spec";
    case Metric::kSpecRel:
      return "spec_rel";
    case Metric::kFro:
      return "fro";
    case Metric::kFroRel:
      return "fro_rel";
    case Metric::kMse:
      return "mse";
    case Metric::kNmse:
      return "nmse";
    case Metric::kMaxAbs:
      return "maxabs";
    case Metric::kAngle:
      return "angle";
    case Metric::kZeroRows:
      return "zero_rows";
    case Metric::kGradQFroRel:
      return "grad_q_fro_rel";
    case Metric::kGradQAngle:
      return "grad_q_angle";
    case Metric::kGradVFroRel:
      return "grad_v_fro_rel";
    case Metric::kGradPairs:
      return "grad_pairs";
  }
  return "?";
}

std::vector<Metric> parse_metrics(const std::string& text) {
  if (trim(text) == "all") return all_metrics();
  std::vector<Metric> out;
  std::vector<std::string> names;
  for (Metric m : known_metrics()) names.push_back(metric_name(m));
  for (const std::string& raw : split(text, ',')) {
    const std::string name = trim(raw);
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end())
      throw UsageError(
          fmt::format("unknown metric '{}' in --metrics: use 'all' or a list of {}", name, join(names, ",")));
    Metric m = known_metrics()[it - names.begin()];
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  return out;
}

double spectral_norm(const MatrixD& a) {
  if (a.size() == 0) return 0;
  const MatrixD gram = a.rows() >= a.cols() ? MatrixD(a.transpose() * a) : MatrixD(a * a.transpose());
  Eigen::SelfAdjointEigenSolver<MatrixD> solver(gram, Eigen::EigenvaluesOnly);
  return std::sqrt(std::max(0.0, solver.eigenvalues().maxCoeff()));
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
      const double cosine = std::clamp(reference.row(i).dot(est.row(i)) / (nr * ne), -1.0, 1.0);
      angle_sum += std::acos(cosine);
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
        values.push_back(diff.size() ? diff.cwiseAbs().maxCoeff() : 0.0);
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
    }
  }
  return values;
}

namespace {

double mean_row_angle(const MatrixD& reference, const MatrixD& estimate) {
  double total = 0;
  for (int64_t i = 0; i < reference.rows(); ++i) {
    const double nr = reference.row(i).norm(), ne = estimate.row(i).norm();
    total += nr == 0 || ne == 0 ? std::numbers::pi / 2
                                : std::acos(std::clamp(reference.row(i).dot(estimate.row(i)) / (nr * ne), -1.0, 1.0));
  }
  return reference.rows() ? total / static_cast<double>(reference.rows()) : 0.0;
}

double relative_fro(const MatrixD& reference, const MatrixD& estimate) {
  const double norm = reference.norm();
  return norm > 0 ? (estimate - reference).norm() / norm : std::numeric_limits<double>::quiet_NaN();
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

}  // namespace attnprobe
