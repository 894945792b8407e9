#pragma once
// yoso-e(tau, input, grad) — the expectation of YOSO's Bernoulli sampling (Zeng et al., "You Only
// Sample (Almost) Once", ICML 2021; docs/estimators/yoso.md). Deterministic, O(n²p):
//   q̂, k̂ = ℓ2-normalised rows (input=l2) or lifted unit rows in p + 2 dims (input=lift, lsh.h);  W_ij = (1 −
//   arccos(clamp(q̂_i·k̂_j, −1, 1))/π)^τ; Y = W·V;  out_i = ℓ2(Y_i)   (no row-sum normalisation: the paper's "N-YOSO").
// The target of yoso(m, tau) with the same τ. The scale s is not used. The cosine is clamped
// before arccos: in float32 q̂·q̂ rounds above 1 for about a fifth of vectors, and the reference
// code returns NaN there. Backward (yoso_backward.h): the exact gradient (grad=exact) or the
// paper's lower bound (grad=lower) of ⟨G, W·V⟩ with respect to q̂ and V, O(n²(p + pv)) in row blocks.
// Causal form (input=l2): W_ij = 0 for j > i; the float32 path skips the key blocks past a block's rows.
// The parameters are shared by the CPU version and the CUDA one.
#include "attnprobe/estimators/yoso/lsh.h"

namespace attnprobe {

struct YosoExpectationParams {
  int tau = 8;               ///< hyperplane bits per hash: W_ij = (1 − θ_ij/π)^τ
  bool lift = false;         ///< input=lift: q̂, k̂ lifted to unit rows in p + 2 dimensions (yoso_inputs in lsh.h)
  bool lower_bound = false;  ///< grad=lower: the backward pass is the paper's lower bound, not the exact gradient
};

}  // namespace attnprobe
