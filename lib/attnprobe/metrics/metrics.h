#pragma once
// The error metrics of docs/metrics.md, all in float64, between a reference R* (n × p) and an
// estimate R (n × p).
#include <string>
#include <vector>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

enum class Metric { kSpec, kSpecRel, kFro, kFroRel, kMse, kNmse, kMaxAbs, kAngle, kZeroRows };

/// All metrics, in CSV order.
const std::vector<Metric>& all_metrics();
const char* metric_name(Metric metric);
/// Parses "spec,angle" or "all"; throws UsageError listing valid names.
std::vector<Metric> parse_metrics(const std::string& text);

/// Largest singular value. Computed from the smaller Gram matrix (p × p for a tall n × p matrix)
/// with a symmetric eigensolver: ~1 ms at 4096 × 64 where Eigen's operatorNorm() forms n × n.
double spectral_norm(const MatrixD& a);

/// Quantities of the reference reused by every trial compared against it.
struct ReferenceNorms {
  double spec = 0;  ///< ‖R*‖₂
  double fro = 0;   ///< ‖R*‖_F
};
ReferenceNorms reference_norms(const MatrixD& reference);

/// One value per entry of `which`, in that order. Relative metrics are NaN when the reference
/// norm is 0 (the ratio is undefined; the absolute metric says all there is to say).
std::vector<double> compute_metrics(const MatrixD& reference, const ReferenceNorms& norms, const MatrixF& estimate,
                                    const std::vector<Metric>& which);

}  // namespace attnprobe
