#pragma once
// The error metrics of docs/metrics.md, all in float64, between a reference R* (n × p) and an
// estimate R (n × p).
#include <string>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/estimators/estimator.h"

namespace attnprobe {

enum class Metric {
  kSpec,
  kSpecRel,
  kFro,
  kFroRel,
  kMse,
  kNmse,
  kMaxAbs,
  kAngle,
  kZeroRows,
  kGradQFroRel,  ///< gradient metrics (docs/metrics.md): only when asked for by name
  kGradQAngle,
  kGradVFroRel,
  kGradPairs,
};

/// The output metrics that `all` (the default) selects, in CSV order.
const std::vector<Metric>& all_metrics();
/// Every metric, `all_metrics()` then the gradient metrics, which cost a backward pass and are
/// computed only when named in --metrics.
const std::vector<Metric>& known_metrics();
bool is_gradient_metric(Metric metric);
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
/// norm is 0 (the ratio is undefined; the absolute metric says all there is to say). Gradient
/// metrics come back NaN here: set_gradient_metrics fills them.
std::vector<double> compute_metrics(const MatrixD& reference, const ReferenceNorms& norms, const MatrixF& estimate,
                                    const std::vector<Metric>& which);

/// Fills the gradient metrics of `which` in `values` (one per entry of `which`, as compute_metrics
/// returns them), comparing `estimate` with `reference` (docs/metrics.md):
///   grad_q_fro_rel = ‖∇̂_Q − ∇_Q‖_F/‖∇_Q‖_F,  grad_q_angle = mean row angle (a zero row counts π/2),
///   grad_v_fro_rel = ‖∇̂_V − ∇_V‖_F/‖∇_V‖_F,  grad_pairs = the estimate's pair_fraction.
/// NaN when either side is null (no backward form) or the shapes differ.
void set_gradient_metrics(const Gradients* reference, const Gradients* estimate, const std::vector<Metric>& which,
                          std::vector<double>& values);

}  // namespace attnprobe
