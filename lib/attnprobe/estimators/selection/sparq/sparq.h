#pragma once
// sparq(r, k, window, realloc, share, agg) — SparQ attention: approximate scores from the query's largest channels
// (docs/estimators/selection.md). Target: softmax. Class A: row t at position t reads its own query and the keys V_t
// it sees.
//  1. Channels I: the r largest |q_{t,d}| (ties to the lower channel); share=group: the r largest Σ_h |q^{(h)}_{t,d}|
//     over the kv group's heads, one I for the group. r ≥ p: every channel (a channel budget clips like a key budget).
//  2. Approximate logits ŝ_j = q_{t,I}·k_{j,I} / τ, τ = √(p·‖q_I‖₁/‖q‖₁) (the reference's "sqrt(q_coverage ·
//     head_size)"; not multiplied by s; ŝ = 0 for a zero query), float64 from the float32 inputs.
//  3. Kept set: the window W_t = [t − window + 1, t] ∩ V_t always, plus the k − |W_t| best keys of V_t ∖ W_t by ŝ (by
//     the group's aggregate of the heads' ŝ with share=group: agg=logit sums them), ties to the older key;
//     k ≥ |V_t| keeps V_t (exact).
//  4. realloc=1: α = Σ_{j∈S_t} softmax_{V_t}(ŝ)_j of the row's own head, v̄_t = the mean of v over V_t, and
//     ô = α·softmax_{S_t}(ℓ)·V + (1 − α)·v̄_t: one completion term (v̄_t, mass (1 − α)/α·Σ_S e^{ℓ}, stated relative to
//     the kept mass; log((1 − α)/α) from the two exponential sums, no cancellation when α ≈ 1). An empty kept set
//     (k = window = 0) gives v̄_t. realloc=0: ô = softmax_{S_t}(ℓ)·V, a renormalised selection (tail metrics apply).
// Bias: the selection drops the tail's mass like topk but ranks by ŝ, so it can miss heavy keys; realloc=1 puts
// 1 − α of the output on v̄_t, which is exact only when the dropped keys' mean weighted value is v̄_t and α is the
// kept mass. The reference's (k, local_k) is sparq(k = k + 1, window = local_k + 1) (its current key is free).
// Cost per row: |V_t|·r multiply-adds for ŝ (keys_scored = |V_t|·r/p, p-dimensional equivalents), p·G for the
// channels, min(k, |V_t|)·(p + pv) for the output; v̄_t from prefix sums of V computed once a call (O(n·pv)).
// `window` is a position: under the full mask only window = 0. k ≥ window (exit 2 otherwise: k counts the window).
#include <cstdint>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

struct SparqParams {
  int64_t r = 16;                     ///< query channels the approximate scores read
  int64_t k = 256;                    ///< keys attended, the window's included (the samples knob)
  int64_t window = 64;                ///< the last keys up to the query's own, always kept
  bool realloc = true;                ///< the value mean v̄_t takes the mass 1 − α the kept keys lack
  Share share = Share::kGroup;        ///< the reference groups channels and scores over GQA
  Aggregate agg = Aggregate::kLogit;  ///< by the sum of the heads' approximate logits
};

}  // namespace attnprobe
