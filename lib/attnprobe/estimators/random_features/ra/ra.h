#pragma once
// ra(S, variant, noise) — randomized attention (Zheng et al., "Linear Complexity Randomized
// Self-attention Mechanism", ICML 2022, §3; docs/estimators/random-features.md). Target: softmax. O(n²p) per sample.
// For query i and sample s, with π_i = softmax_j(s·q_i·k_j):
//   unbiased: j* ~ π_i, ω = q̃_i + k̃_{j*} + ε;   biased: ω = q̃_i + Σ_j π_i(j)·k̃_j + ε;
//   out_i = (1/S)·Σ_s f(ω_s),  f(ω) = Σ_j softmax_j(ω·k̃_j − ‖k̃_j‖²/2)·v_j.
// `unbiased` with noise=scaled (ε ~ N(0, I) in the scaled space, as the paper states) is unbiased
// for exact attention (Prop. 3.2; tested). noise=raw draws ε in raw units (std √s in the scaled
// space), as the reference code does, and is biased (~10% relative; the test detects it).
// f(ω) is attention of the query ω over keys k̃ with a per-key bias −‖k̃‖²/2, i.e. plain attention
// of [ω, 1] over [k̃, −‖k̃‖²/2]: the blocked float32 kernel computes it.
// Causal form: π_i and f_i(ω) over keys j ≤ i (the draws are indexed by (i, s) as before; O(n²p)).
#include <cstdint>

namespace attnprobe {

struct RaParams {
  int64_t samples = 1;     ///< S, samples of ω per query
  bool unbiased = true;    ///< variant=unbiased: ω around q + k_{j*}, j* ~ the softmax row (else its mean key)
  bool raw_noise = false;  ///< noise=raw: ε with std √s in the scaled space, as the reference code (biased)
};

}  // namespace attnprobe
