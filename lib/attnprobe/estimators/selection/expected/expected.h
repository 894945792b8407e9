#pragma once
// expected(budget, sink, future, cov, vnorm, eps, stats, share, agg) — kvpress's Expected Attention: the prompt's
// cache compressed once by the attention that future queries are expected to pay each key
// (docs/estimators/selection.md). Target: softmax. Class B: the decode rows of a slice cut with --queries last:W come
// after a prompt of P = N − W tokens. Future queries are modelled as q ~ N(μ', Σ'), from the mean μ and covariance Σ
// (divided by the count) of the prompt's query rows [sink, P):
//   stats=post (default): the rows as dumped, after any rotary embedding: μ' = μ, Σ' = Σ;
//   stats=rope (the press itself; the dump's rope_inv_freq, HeadView::rope_inv_freq): each row un-rotated to its
//     pre-RoPE q̃_i = R_iᵀq_i (R_i orthogonal, rotate_half pairing), μ̃ and Σ̃ of those, then averaged over the
//     `future` positions after the prompt: R̄ = mean_{τ=P}^{P+future−1} R_τ, μ' = R̄μ̃, Σ' = R̄Σ̃R̄ᵀ.
// Since E[e^{s·q·k}] = exp(s·k·μ' + s²·kᵀΣ'k/2), each candidate key j ∈ [sink, P) scores
//   z_j = s·k_j·μ' + (s²/2)·k_jᵀΣ'k_j  (cov=0: the first term),  π = softmax(z) over the candidates,
// then, with share=group, the group's mean (max; logit: the sum) of π, and with vnorm=1, (π_j + eps)·‖v_j‖.
// K_P = the sink keys ∪ the budget − sink best candidates (ties to the older key), every prompt key when
// budget ≥ P; row t ≥ P attends K_P ∪ [P, t] (w = 1). Deterministic; needs the prompt's query rows and P > sink + 1.
// Cost: (P − sink)·p² for Σ and P·p² for the scores (stats=rope: p³ more for R̄Σ̃R̄ᵀ), once per call; then
// |S_t|·(p + pv) per row.
#include <cstdint>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

/// Which statistics model the future queries: the dumped (rotated) rows', or their pre-RoPE ones rotated forward.
enum class ExpectedStats { kPost, kRope };

struct ExpectedParams {
  int64_t budget = 256;  ///< prompt keys kept, the sinks included
  int64_t sink = 4;      ///< the first keys, kept, and left out of the query statistics
  int64_t future = 512;  ///< stats=rope: the future positions P..P + future − 1 the rotation is averaged over
  bool cov = true;       ///< the covariance term of the expected score
  bool vnorm = true;     ///< scale the expected weight by the value norm
  double eps = 0;        ///< added to the weight before the value norm
  ExpectedStats stats = ExpectedStats::kPost;
  Share share = Share::kGroup;
  Aggregate agg = Aggregate::kMean;
};

}  // namespace attnprobe
