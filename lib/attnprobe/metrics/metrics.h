#pragma once
// The error metrics of docs/metrics.md, all in float64, between a reference R* (n × p) and an
// estimate R (n × p). Their names and groups are in catalogue.h.
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/estimators/estimator.h"
#include "attnprobe/metrics/catalogue.h"

namespace attnprobe {

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

/// What the precision metrics compare (all n × pv): R̂ the estimate in float32, R̂_ℓ the same draws in the case's
/// precision ℓ (inputs and declared intermediates rounded, Capabilities::rounding), R_ℓ exact attention in ℓ (for
/// f32: exact_attention_f32; for bf16/f16: exact_attention_rounded).
struct RoundingParts {
  const MatrixF& float32_estimate;
  const MatrixF& rounded_estimate;
  const MatrixF& rounded_exact;
};

/// One value per entry of `which`, all precision metrics (catalogue.h), against the float64 reference R*:
///   approx_err = ‖R̂ − R*‖/‖R*‖,  round_floor = ‖R_ℓ − R*‖/‖R*‖,  round_excess = ‖R̂_ℓ − R̂‖/‖R*‖,
///   fa_ratio = ‖R̂_ℓ − R*‖/‖R_ℓ − R*‖ (FlashAttention's test: a kernel in ℓ errs at most ~2× the naive one),
/// Frobenius norms, `_spec` the spectral ones; nonfinite_rows = the fraction of R̂_ℓ's rows with a NaN or infinity.
/// Non-finite inputs give NaN or inf values, never an exception.
std::vector<double> precision_metrics(const MatrixD& reference, const ReferenceNorms& norms, const RoundingParts& parts,
                                      const std::vector<Metric>& which);

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
