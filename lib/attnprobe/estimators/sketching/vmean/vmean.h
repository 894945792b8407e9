#pragma once
// vmean — the rank-one baseline of the Skeinformer paper (docs/estimators/sketching.md):
// out_i = (1/n)·Σ_j v_j for every query i, i.e. uniform attention. Deterministic; exact when
// attention is uniform, and the error every sampling method must beat on peaked attention.
// Causal form: out_i = (1/(i+1))·Σ_{j≤i} v_j, a running sum in float64 (so row i never sees j > i).
// Backward of L = ⟨G, out⟩: ∇_Q = 0 (the output ignores Q), every row of ∇_V = (1/n)·Σ_i g_i; causal:
// ∇_V_j = Σ_{i≥j} g_i/(i + 1), a suffix sum.
#include "attnprobe/estimators/param_set.h"

namespace attnprobe {

/// vmean takes no parameters.
using VMeanParams = NoParams;

}  // namespace attnprobe
