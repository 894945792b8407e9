#pragma once
// softmax — exact attention, the target of most estimators (docs/estimators/exact.md).
// As an estimator it runs the blocked float32 path, so its row in a sweep shows the float32
// rounding floor (~1e-7 relative) against the float64 reference; as a reference it is float64.
// Causal form (mask = causal): keys j ≤ i only; the float32 path skips the masked key blocks.
// Backward (float64, blocks of 256 query rows, never n × n): with A = softmax(s·QKᵀ) and L = ⟨G, A·V⟩,
//   dA = G·Vᵀ,  dS = A ⊙ (dA − rowsum(A ⊙ dA)),  ∇_Q = s·dS·K,  ∇_V = Aᵀ·G;
// causal: A the masked softmax, whose zeros above the diagonal keep dS and Aᵀ·G there at 0.
// Window and decode forms: the same with the rows' geometry (view/mask.h): query rows at positions against a
// longer cache, each seeing keys 0..t (causal), t−W+1..t (window:W) or all (full).
#include "attnprobe/estimators/param_set.h"

namespace attnprobe {

/// softmax takes no parameters.
using SoftmaxParams = NoParams;

}  // namespace attnprobe
