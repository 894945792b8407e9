#pragma once
// uniform_keys(b) — uniform key sampling with Horvitz–Thompson weights: the baseline every sampling
// estimator of attention should beat (docs/estimators/sampling.md). Target: softmax.
//   Row t keeps each key j of the keys it sees, V_t (all n; causal: 0..t; window:W: t−W+1..t; the same for
//   rows at positions against a longer cache), independently with probability
//   π_t = min(1, b/|V_t|) (Bernoulli sampling: E|S_t| = min(b, |V_t|)). With ℓ_j = s·q_t·k_j,
//     N̂_t = Σ_{j∈S_t} e^{ℓ_j}·v_j / π_t,   D̂_t = Σ_{j∈S_t} e^{ℓ_j} / π_t,   out_t = N̂_t / D̂_t.
// N̂_t and D̂_t are unbiased for N_t = Σ_{V_t} e^{ℓ_j}·v_j and D_t (every key has π_t > 0); the ratio is
// biased, O(1/b). π_t is the same for every key of a row, so it cancels in the ratio: out_t is the softmax
// over S_t. b ≥ |V_t| keeps every key: exact. An empty sample gives the zero row (counted in zero_rows).
// Draws: the Bernoulli process is read by geometric gaps — the s-th kept key is the previous one plus
// 1 + ⌊log u_{t,s} / log(1 − π_t)⌋ (the first: ⌊log u_{t,0} / log(1 − π_t)⌋), u_{t,s} the uniform at
// (row t, draw s) of Purpose::kColumnSample, t the row's absolute position — so a row's sample depends on its
// position and V_t only: the causal form reads no later token, a decode row draws what the same row of the
// whole slice draws, and a row costs O(b) draws, not O(n).
// Cost O(n·b·(p + pv)), float32 like the exact kernel (logits shifted by the row's maximum).
#include <cstdint>
#include <vector>

#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

struct UniformKeysParams {
  int64_t budget = 64;  ///< b: keys kept per row in expectation
};

/// Row `row`'s sample among `visible` keys (0..visible−1), ascending; `inclusion` (optional) receives π.
std::vector<int64_t> uniform_keys_sample(int64_t visible, int64_t budget, const RandomStream& stream, int64_t row,
                                         double* inclusion = nullptr);

}  // namespace attnprobe
