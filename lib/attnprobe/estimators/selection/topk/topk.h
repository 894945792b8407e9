#pragma once
// topk(k, sink, window) — the oracle top-k of every sparse-attention paper (docs/estimators/selection.md).
// Target: softmax. Row t at position t sees the keys V_t of the mask; its fixed part F_t is the first `sink`
// keys and the last `window` keys up to t (window counts the query's own key), both within V_t; the rest R_t is
// ranked by the exact logit ℓ_j = s·q_t·k_j in float64, ties to the older key, and S_t = F_t ∪ the k best of R_t.
// Output: softmax over S_t (w = 1), so the error is the tail decomposition of the page: k ≥ |R_t| is exact.
// share=group ranks R_t by the kv group's aggregate (sharing.h: mean or max of each head's softmax over R_t, or
// the sum of the logits). Deterministic; a row needs its own query and the keys it sees only (decode forms under every
// mask). sink or window > 0 needs positions (causal or window mask); under the full mask only sink = window = 0. Cost
// per row: |V_t|·p scores (float64) plus |S_t|·(p + pv) for the output.
#include <cstdint>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

struct TopkParams {
  int64_t k = 256;     ///< keys chosen by score beyond the fixed part
  int64_t sink = 0;    ///< the first keys, always kept
  int64_t window = 0;  ///< the last keys up to the query's own, always kept
  Share share = Share::kHead;
  Aggregate agg = Aggregate::kMean;
};

}  // namespace attnprobe
