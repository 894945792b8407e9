#pragma once
// vattention(sink, window, k, base, eps, delta, draw) — vAttention: oracle top-k plus a CLT-budgeted uniform
// sample of the rest (docs/estimators/sampling_decode.md). Target: softmax.
// Row t at position t, ℓ_j = s·q_t·k_j (float64), e_j = exp(ℓ_j − max_{V_t} ℓ). T_t = topk(k, sink, window)'s set
// (the first `sink` keys, the last `window` up to t, the k best of the rest by ℓ, ties to the older key);
// R_t = [sink, t − window + 1), r = |R_t| (under the full mask sink = window = 0: R_t = every key); r < 2: exact.
//  1. Pilot: b₀ = max(2, ⌊base·r⌋) draws iid uniform on R_t (Purpose::kPilotSample at (t, u)); σ̂ = their sample
//     standard deviation of e (divisor b₀ − 1, at least 1e-8); D̂ = Σ_{T_t} e + (r/b₀)·Σ_{distinct pilot keys} e.
//  2. Budget b = min(r, max(b₀, ⌊min(max(x, 1), r)⌋)), x = (z·σ̂·r / max(ε·D̂, 1e-8))², z = Φ⁻¹(1 − δ): the
//     tail estimate r·mean(e) has standard deviation r·σ/√b, so b ≥ (zσr/(εD))² keeps a one-sided error above εD
//     to probability ≈ δ (vattention_budget).
//  3. Samples (Purpose::kColumnSample), weights by `draw`:
//     hh (default): b draws iid uniform on R_t at (t, u); a draw outside T_t adds r/b to its key's weight
//        (w_j = c_j·r/b), draws inside T_t are dropped. Given b, and the pilot being independent of the samples,
//        N̂ and D̂ are unbiased; the ratio is biased O(1/b).
//     ref (the sparse-attention-hub as coded): the same draws, each distinct key outside T_t with weight r/b
//        (repeats collapse): the tail is biased low by c = (r/b)(1 − (1 − 1/r)^b) (0.632 at b = r).
//     wor (the paper's reading): U_t = R_t ∖ T_t, n_u = |U_t|; pilot, σ̂, D̂ and the budget over U_t with r = n_u;
//        b' = min(b, n_u) keys without replacement, the b' largest uniforms at (t, key) (Gumbel-top-b' of equal
//        weights), each with weight n_u/b' (Horvitz–Thompson, π = b'/n_u); b' = n_u is exact.
// Random; a row reads its own query and keys ≤ t only, its draws keyed by its position (decode forms).
// keys_attended = |T_t| + the distinct sampled keys outside T_t; keys_scored = |V_t| (the oracle) + b₀; the
// pilot's b₀ is the metric `pilot`, and eps the ε of eps_cover.
// Cost per row: |V_t|·p scores, b₀ + b draws, |S_t|·(p + pv) for the output.
#include <cstdint>

namespace attnprobe {

enum class VattentionDraw { kHh, kRef, kWor };

struct VattentionParams {
  int64_t sink = 4;     ///< the first keys, exact
  int64_t window = 64;  ///< the last keys up to the query's own, exact
  int64_t k = 64;       ///< the oracle top-k beyond sink and window
  double base = 0.05;   ///< the pilot's fraction of the sampled range
  double eps = 0.25;    ///< ε: the relative error the budget aims at
  double delta = 0.25;  ///< δ: the probability it may exceed it
  VattentionDraw draw = VattentionDraw::kHh;
};

/// Φ⁻¹(prob) for prob in (0, 1): the standard normal quantile (Acklam's rational approximation, then one Halley
/// step on erfc: ~1e-15 relative).
double normal_quantile(double prob);

/// The sample budget b = min(r, max(b₀, ⌊min(max(x, 1), r)⌋)), x = (Φ⁻¹(1 − δ)·σ̂·r / max(ε·D̂, 1e-8))²: the lower
/// clamp is the pilot's b₀, the upper the range's r.
int64_t vattention_budget(double sigma, double d_hat, int64_t r, double eps, double delta, int64_t b0);

}  // namespace attnprobe
