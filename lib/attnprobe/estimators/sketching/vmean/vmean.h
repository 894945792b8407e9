#pragma once
// vmean — the rank-one baseline of the Skeinformer paper (docs/estimators/sketching.md):
// out_i = (1/n)·Σ_j v_j for every query i, i.e. uniform attention. Deterministic; exact when
// attention is uniform, and the error every sampling method must beat on peaked attention.
// Causal and window forms: out_i = the mean of the values row i sees (keys 0..t, or t−W+1..t, for the row
// at position t), a sum in float64 in key order (so row i never sees j > t). Decode form: the same for rows
// at positions against a longer cache (full: the mean of every key).
// Backward of L = ⟨G, out⟩: ∇_Q = 0 (the output ignores Q), every row of ∇_V = (1/n)·Σ_i g_i; causal:
// ∇_V_j = Σ_{i≥j} g_i/(i + 1), a suffix sum.
#include "attnprobe/estimators/param_set.h"

namespace attnprobe {

/// vmean takes no parameters.
using VMeanParams = NoParams;

}  // namespace attnprobe
