#pragma once
// lara(C, proposal, weights, beta, mode, noise) — Linear randomized attention (Zheng et al.,
// "Linear Complexity Randomized Self-attention Mechanism", ICML 2022, §4; docs/estimators/random-features.md).
// Target: softmax. C proposals q_c, one sample ω_c each, combined by multiple importance sampling:
//   landmarks q̄_c, k̄_c = means of C contiguous segments of q̃, k̃ (the scaled space);
//   proposal means μ_c: segment q̄_c + k̄_c | attn q̄_c + Σ_j softmax_j(q̄_c·k̃_j)·k̃_j |
//     mixed q̄_c + Σ_c′ softmax_c′(k̄_c·k̄_c′)·k̄_c′ | mixture Σ_j softmax_j(q̄_c·k̃_j)·N(q̄_c + k̃_j, I);
//   ω_c = μ_c + ε_c (mode=sample) or μ_c (mode=mean, the reference code's evaluation mode);
//   w_nc = softmax_c(log α_nc(ω_c) + log p̃_n(ω_c) − log q_c(ω_c)),
//   log p̃_n(ω) = log N(ω; 0, I) + log ξ(q_n, ω) + log Σ_j ξ(k_j, ω);
//   out_n = Σ_c w_nc·f(ω_c), f the key–value average (shared by all queries: O(C·n·p)).
// α are the MIS weights of lara.h, clamped below at 1e-8 as the reference code does. noise=raw
// reproduces the reference code: ε is drawn with std √s (raw units) while every density (q_c, the
// balance heuristic, α) is still evaluated as N(·; μ_c, I) — the draw and the density disagree, and
// the option measures that code, it does not fix it (its extra bias is tested). Self-normalised:
// consistent (noise=scaled), biased. estimate() is float32 and O(n) in memory (see there): the key-side
// sums on the chunked exact kernel, then query blocks, all on the call's pool; the proposals, their
// C × C densities and the per-sample constants are float64 (the attn and mixture proposals still form
// C × n π). draw() (weights()) is the same in float64 with whole n × C matrices.
#include <cstdint>

namespace attnprobe {

enum class LaraProposal { kSegment, kAttn, kMixed, kMixture };
enum class LaraWeighting { kBalance, kCoupled, kDecoupled };

struct LaraParams {
  int64_t proposals = 64;                               ///< C (segments); 1 is the single-proposal ablation
  LaraProposal proposal = LaraProposal::kSegment;       ///< the proposal means (Eqs. 32–35)
  LaraWeighting weighting = LaraWeighting::kDecoupled;  ///< the MIS weights (Eqs. 36–38)
  double beta = 1;                                      ///< query-specific weighting strength
  bool sample = true;                                   ///< mode=sample: ω_c = μ_c + ε (else μ_c, deterministic)
  bool raw_noise = false;                               ///< noise=raw: ε with std √s, densities still N(μ, I)
};

}  // namespace attnprobe
