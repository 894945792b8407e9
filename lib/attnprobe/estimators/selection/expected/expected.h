#pragma once
// expected(budget, sink, cov, vnorm, eps, share, agg) — kvpress's Expected Attention: the prompt's cache compressed
// once by the attention that future queries are expected to pay each key (docs/estimators/selection.md). Target:
// softmax. Class B: the decode rows of a slice cut with --queries last:W come after a prompt of P = N − W tokens.
// Future queries are modelled as q ~ N(μ, Σ), the mean and covariance (divided by the count) of the prompt's query
// rows [sink, P) — the rows as dumped, after any rotary embedding (the press itself averages pre-RoPE statistics
// over future rotations; a dump does not carry the rotary frequencies, so this is its dump-computable form). Since
// E[e^{s·q·k}] = exp(s·k·μ + s²·kᵀΣk/2), each candidate key j ∈ [sink, P) scores
//   z_j = s·k_j·μ + (s²/2)·k_jᵀΣk_j  (cov=0: the first term),  π = softmax(z) over the candidates,
// then, with share=group, the group's mean (max; logit: the sum) of π, and with vnorm=1, (π_j + eps)·‖v_j‖.
// K_P = the sink keys ∪ the budget − sink best candidates (ties to the older key), every prompt key when
// budget ≥ P; row t ≥ P attends K_P ∪ [P, t] (w = 1). Deterministic; needs the prompt's query rows and P > sink + 1.
// Cost: (P − sink)·p² for Σ and P·p² for the scores, once per call; then |S_t|·(p + pv) per row.
#include <cstdint>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

struct ExpectedParams {
  int64_t budget = 256;  ///< prompt keys kept, the sinks included
  int64_t sink = 4;      ///< the first keys, kept, and left out of the query statistics
  bool cov = true;       ///< the covariance term of the expected score
  bool vnorm = true;     ///< scale the expected weight by the value norm
  double eps = 0;        ///< added to the weight before the value norm
  Share share = Share::kGroup;
  Aggregate agg = Aggregate::kMean;
};

}  // namespace attnprobe
