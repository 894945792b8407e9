#pragma once
// kdeformer(m, b, r, order, probs) — KDEformer as its code computes it (Zandieh, Han, Daliri, Karbasi,
// ICML 2023; reference majid-daliri/kdeformer). Target: softmax. With ṽ_j = [v_j, 1] (the last
// coordinate carries the denominator) and the sortLSH blocks (sort_lsh.h):
//   Ŝ_i = Σ_{j∈H_i} e_ij·ṽ_j (exact);  t_1..t_m iid ∝ P with replacement (Purpose kColumnSample);
//   R̂_i = Σ_u [β_K(t_u) ≠ β_Q(i)]·e_{i t_u}·ṽ_{t_u} / (m·P_{t_u});  F_i = Ŝ_i + R̂_i;  out_i = F_i[:pv] / F_i[pv].
// P: vnorm (the code) w_j = ‖ṽ_j‖/σ² + 1/n, σ² the largest eigenvalue of ṼᵀṼ (the reference runs 20
// power steps; here an exact (pv+1)² eigensolve); uniform, 1/n (then this is `hyper(mask=1)` with the
// same draws); colnorm, our O(n²) oracle: ∝ ‖(B∘(1−M^H))_{:,j}‖·‖ṽ_j‖ with B = D⁻¹A, the variance-optimal
// AMM probabilities for the residual — what a KDE would approximate. Given the hash, F_i is unbiased for
// [N_i, D_i] (every P_j > 0 under vnorm/uniform; colnorm gives 0 only to columns masked for every
// query, whose residual is 0); the ratio is biased. The paper's KDE for D and column-norm sampling are
// not in the code (no KDE at all). Reference differences: no max subtraction (float32 exp overflows once
// s·q·k > 88; here one shift per row serves both parts), b | n required (not here), and its `mask_size`
// mask is zeroed in place on CPU so a second call inherits the first's zeros. No causal form.
// Cost O(n·r·p + n log n + n·(b + m)·(p + pv) + pv³); colnorm adds O(n²·p). float32 except the hash and
// the weights (float64: an O(n·pv) pass, and P_j enters as 1/P_j).
#include <cstdint>
#include <vector>

#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/sorted_lsh/sort_lsh.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

enum class KdeProbs { kVnorm, kUniform, kColnorm };

struct KdeformerParams {
  int64_t samples = 128;  ///< m, samples ∝ P with replacement
  int64_t block = 64;     ///< b
  int bits = 7;           ///< r
  BucketOrder order = BucketOrder::kGray;
  KdeProbs probs = KdeProbs::kVnorm;
};

/// Unnormalised sampling weights w_j (n): vnorm ‖ṽ_j‖/σ² + 1/n; uniform 1; colnorm
/// ‖(B∘(1−M^H))_{:,j}‖·‖ṽ_j‖ (O(n²·p) oracle). ṽ_j = [v_j, 1]. vnorm's ṼᵀṼ is summed in fixed row groups
/// on the pool when one is given (the result does not depend on it).
std::vector<double> kdeformer_weights(KdeProbs probs, const HeadView& view, const SortLshBlocks& blocks,
                                      ThreadPool* pool = nullptr);

/// n × pv estimate in precision S; log_denominator, blocks, pool and stored as for hyper; weights (optional)
/// receives w.
template <typename S>
MatrixT<S> kdeformer_attention(const KdeformerParams& params, const HeadView& view, RandomKey key,
                               VectorD* log_denominator = nullptr, std::vector<double>* weights = nullptr,
                               const SortLshBlocks* blocks = nullptr, ThreadPool* pool = nullptr,
                               Precision stored = Precision::kF32);

}  // namespace attnprobe
