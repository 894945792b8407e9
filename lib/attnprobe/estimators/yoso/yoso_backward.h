#pragma once
// YOSO's backward pass (YOSO appendix §1.3–1.4; docs/estimators/yoso.md, "Backward pass"), in float64.
// For the loss L = ⟨G, Y⟩ on the unnormalised output Y = W·V, W_ij = (1 − θ_ij/π)^τ, with
// x_ij = q̂_i·k̂_j = cos θ_ij and q̂, k̂ taken as the inputs (the normalisation's or lifting's
// Jacobian is outside the comparison):
//   exact:        ∇_Q̂ = [(G·Vᵀ) ⊙ τ(1 − θ/π)^{τ−1} ⊘ (π·√(1 − x²))]·K̂,   ∇_V = Wᵀ·G;
//   lower bound:  ∇̃_Q̂ = [(G·Vᵀ) ⊙ (τ/2)(1 − θ/π)^τ]·K̂ (the paper's Eq. 3; no 1/√(1 − x²) blow-up);
//   LSH estimate: the lower bound with W replaced by the m-hash collision average B (unbiased for it
//                 with Gaussian hashing), from bucket tables, never n × n;
//   sparse (§1.4): the lower bound over the pairs that collide in at least one hash, exact weights.
// Shapes: q̂ n × p′, k̂ keys × p′, v keys × pv, g (the upstream gradient) n × pv; codes as lsh_codes
// returns them (row-major n × m and keys × m). Mask::kCausal: the gradient of the causal form, W_ij = 0
// for j > i (each sum over j runs over j ≤ i, each over i over i ≥ j); pair fractions then count the
// n(n + 1)/2 visible pairs.
#include <cstdint>
#include <vector>

#include "attnprobe/estimators/estimator.h"
#include "attnprobe/view/mask.h"

namespace attnprobe {

/// The smallest √(1 − x²) the exact gradient divides by (θ ≥ 1e-6 rad): at x = 1 the gradient is
/// infinite; a pair at exactly x = ±1 uses the fraction's value at this clamp (0 where (1 − θ/π)^{τ−1}
/// vanishes, i.e. x = −1 with τ > 1), never NaN.
inline constexpr double kMinSine = 1e-6;

/// The query rows yoso_expectation_gradient handles at a time (its memory is a few of these × keys).
inline constexpr int64_t kExpectationGradientRows = 256;

/// Exact gradient (lower_bound = false) or the lower bound (true) of YOSO-E; ∇_V = Wᵀ·G either way.
/// Row blocks of kExpectationGradientRows queries: O(n·keys·(p′ + pv)) time, O(rows·keys) memory.
/// pair_fraction = 1.
Gradients yoso_expectation_gradient(const MatrixD& q_hat, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g,
                                    int tau, bool lower_bound, Mask mask = Mask::kFull);

/// YOSO-m's estimate of the lower bound, B_ij = (1/m)·Σ_f [h_f(q̂_i) = h_f(k̂_j)]:
///   ∇_Q̂_i = (τ/2)·Σ_j B_ij (g_i·v_j) k̂_j = (τ/(2m))·Σ_f g_iᵀ·T_f[h_f(q̂_i)],  T_f[c] = Σ_{j: h_f(k̂_j)=c} v_j k̂_jᵀ
///   (per coordinate c of K̂, a YOSO pass with values V ⊙ K̂_{:,c}, all p′ at once);
///   ∇_V_j = Σ_i B_ij g_i, the same tables read transposed (queries fill sums of g, keys read them).
/// O(n·m·p′·pv) after hashing; memory one hash's occupied buckets × p′·pv. pair_fraction NaN.
Gradients yoso_lsh_gradient(const std::vector<uint32_t>& query_codes, const std::vector<uint32_t>& key_codes, int m,
                            int tau, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g, Mask mask = Mask::kFull);

/// The §1.4 sparse form: S_i = {j : h_f(q̂_i) = h_f(k̂_j) for some f};
///   ∇_Q̂_i = Σ_{j∈S_i} (g_i·v_j)(τ/2)W_ij k̂_j,  ∇_V_j = Σ_{i: j∈S_i} W_ij g_i;
/// pair_fraction = Σ_i |S_i| / (n·keys). O(nnz·(m + p′ + pv)) plus sorting the codes.
Gradients yoso_sparse_gradient(const std::vector<uint32_t>& query_codes, const std::vector<uint32_t>& key_codes, int m,
                               int tau, const MatrixD& q_hat, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g,
                               Mask mask = Mask::kFull);

}  // namespace attnprobe
