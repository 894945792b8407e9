#pragma once
// LARA's multiple-importance-sampling weights (Zheng et al., ICML 2022, Eqs. 36–38), exposed so
// that the MIS identity Σ_c α_nc(ω) = 1 can be tested at a fixed ω.
#include "attnprobe/common/matrix.h"
#include "attnprobe/estimators/random_features/lara/lara.h"

namespace attnprobe {

/// α_nc(ω) for one ω and all n, c (n × C), before clamping:
///   balance:   BH_c(ω) = q_c(ω) / Σ_c′ q_c′(ω)
///   coupled:   BH_c(ω) + β·q_c(ω)·(r′_nc − Σ_c′ BH_c′(ω)·r′_nc′)
///   decoupled: BH_c(ω) + β·(r′_nc − (1/C)·Σ_c′ r′_nc′)
/// log_q: log q_c(ω) for c = 1..C; r_prime: r′_nc (n × C, each column sums to 1 over n).
MatrixD lara_alpha(LaraWeighting weighting, double beta, const RowVectorD& log_q, const MatrixD& r_prime);

/// What the estimator needs: column c of the result is α_{·c}(ω_c), each function at its own sample
/// (n × C). log_q(c, c′) = log q_c′(ω_c). Equal to column c of lara_alpha(…, log_q.row(c), …) for
/// every c (tested), in O(n·C) (balance, decoupled) or one n × C × C product (coupled).
MatrixD lara_alpha_at_samples(LaraWeighting weighting, double beta, const MatrixD& log_q, const MatrixD& r_prime);

/// The balance heuristic at every sample: row c is BH_·(ω_c) = q_·(ω_c) / Σ_c′ q_c′(ω_c) (C × C).
MatrixD lara_balance(const MatrixD& log_q);
/// lara_alpha_at_samples with balance = lara_balance(log_q) computed once by the caller (for each query
/// block), in the precision of r_prime: MatrixD, or MatrixF for the estimator's float32 blocks (the C × C
/// densities stay float64).
template <typename Matrix>
Matrix lara_alpha_at_samples(LaraWeighting weighting, double beta, const MatrixD& log_q, const MatrixD& balance,
                             const Matrix& r_prime);
extern template MatrixD lara_alpha_at_samples(LaraWeighting, double, const MatrixD&, const MatrixD&, const MatrixD&);
extern template MatrixF lara_alpha_at_samples(LaraWeighting, double, const MatrixD&, const MatrixD&, const MatrixF&);

}  // namespace attnprobe
