#pragma once
// The error metrics of docs/metrics.md, all in float64, between a reference R* (n × p) and an
// estimate R (n × p).
#include <optional>
#include <string>
#include <string_view>
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
  kZeroRows,  // one value per trial
  kBiasFroRel,
  kVarFroRel,
  kBiasSpecRel,  // one value per case (trial −1)
  kGradQFroRel,  // gradient metrics, one value per trial, only when named (docs/metrics.md)
  kGradQAngle,
  kGradVFroRel,
  kGradPairs,
  kRowTv,
  kRowKl,
  kTopkRecall,  // per trial, from the implied attention weights (O(n²): asked for by name)
};

/// The per-trial metrics, in CSV order: what `--metrics all` selects.
const std::vector<Metric>& all_metrics();
/// The case-level metrics (docs/metrics.md): computed from all T ≥ 2 trials of a case and written
/// with trial −1; selected by name or by the word `case` in `--metrics`.
const std::vector<Metric>& case_metrics();
bool is_case_metric(Metric metric);
/// The gradient metrics (per trial): they cost a backward pass, so only `--metrics` names select them.
const std::vector<Metric>& gradient_metrics();
bool is_gradient_metric(Metric metric);
/// The attention-weight metrics (docs/metrics.md): per trial, for estimators registered with
/// `weights`; O(n²), so selected only by name or by the word `weights` in `--metrics`.
const std::vector<Metric>& weight_metrics();
bool is_weight_metric(Metric metric);
const char* metric_name(Metric metric);
/// Every metric attnprobe computes (per trial, per case, weights, gradients), in that order.
const std::vector<Metric>& known_metrics();
/// The metric called `name`, or nullopt for a name attnprobe does not compute.
std::optional<Metric> find_metric(std::string_view name);
/// Every metric is ≥ 0 (or NaN/+inf), and all but `topk_recall` are errors, larger is worse; topk_recall
/// (a fraction of the right keys found) is larger is better. `check` reads its direction from here.
bool larger_is_better(Metric metric);
/// Parses "spec,angle", "all" (the per-trial metrics), "case" (the case-level ones), "weights" (the
/// attention-weight ones) or a mix such as "all,case"; throws UsageError listing valid names.
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

/// The running mean R̄ and sum of squared deviations of a case's trial estimates (Welford, float64,
/// per element), so the case-level metrics never keep T estimates. Fold the trials in trial order:
/// the result is then the same for any thread count.
class CaseAccumulator {
 public:
  void add(const MatrixF& estimate);
  int64_t count() const { return count_; }
  /// The case-level metrics in `which` against the reference: bias_fro_rel = ‖R̄ − R*‖_F/‖R*‖_F,
  /// var_fro_rel = Σ_t ‖R_t − R̄‖_F² / (T − 1) / ‖R*‖_F², bias_spec_rel = ‖R̄ − R*‖₂/‖R*‖₂. So the
  /// trials' mean nmse = bias_fro_rel² + var_fro_rel·(T − 1)/T.
  std::vector<double> metrics(const MatrixD& reference, const ReferenceNorms& norms,
                              const std::vector<Metric>& which) const;

 private:
  MatrixD mean_, m2_;
  int64_t count_ = 0;
};

}  // namespace attnprobe
