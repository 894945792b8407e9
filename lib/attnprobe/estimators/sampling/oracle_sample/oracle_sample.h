#pragma once
// oracle_sample(b) — sampling from the exact attention weights, MagicPIG's "oracle sampling" baseline
// (docs/estimators/sampling_decode.md). Target: softmax. Row t at position t sees the keys V_t of the mask, with
// ℓ_j = s·q_t·k_j (float64 from the float32 inputs) and a_j = e^{ℓ_j} / D, D = Σ_{V_t} e^{ℓ}. It draws
// j_1..j_b iid with P(j) = a_j by inverse CDF on the uniform at (t, u) of Purpose::kColumnSample (draw u of the
// row at absolute position t), and keeps the distinct draws S_t with the Hansen–Hurwitz weights
//   w_j = c_j / (b·a_j),  c_j the multiplicity,   so  D̂ = Σ_S w_j e^{ℓ_j} = D exactly  and  ô = (1/b)·Σ_u v_{j_u}.
// Unbiased for o, ratio included (the ideal importance sampler): Var ô = Σ_j a_j‖v_j − o‖² / b. Random; a row
// reads its own query and the keys it sees only, its draws keyed by its position (decode forms under every mask).
// Cost per row: |V_t|·p scores (float64), b·log|V_t| draws, |S_t|·(p + pv) for the output.
#include <cstdint>

namespace attnprobe {

struct OracleSampleParams {
  int64_t b = 256;  ///< draws per row, with replacement
};

}  // namespace attnprobe
