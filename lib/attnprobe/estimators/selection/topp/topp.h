#pragma once
// topp(p, sink, window, strict) — the oracle top-p (mass threshold) of the sparse-attention hub
// (docs/estimators/selection.md). Target: softmax. F_t and R_t as in topk; the masses ã_j = e^{ℓ_j}/Σ_{R_t} e^{ℓ}
// over the residual (= a_j when sink = window = 0) ordered by (ã descending, index ascending); S_t = F_t ∪ the
// shortest prefix whose cumulative mass reaches p (p ≥ 1: all of R_t). strict=1 is the hub's rule: the shortest
// prefix with cumulative mass above p, then every key whose mass is at least that prefix's last one (ties join).
// Deterministic, w = 1; decode forms under every mask; sink or window > 0 needs a causal or window mask.
#include <cstdint>

namespace attnprobe {

struct ToppParams {
  double p = 0.9;       ///< the attention mass to keep, of the residual R_t
  int64_t sink = 0;     ///< the first keys, always kept
  int64_t window = 0;   ///< the last keys up to the query's own, always kept
  bool strict = false;  ///< the hub's rule (mass above p, ties at the threshold join)
};

}  // namespace attnprobe
