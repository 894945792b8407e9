#pragma once
// h2o(heavy, window, share, agg) — H2O, the Heavy-Hitter Oracle cache, replayed (docs/estimators/selection.md). Target:
// softmax. Class C: a cache C of at most heavy + window − 1 keys and an accumulated attention acc_j per key.
// Prefill (the prompt's P rows, no eviction inside it): acc_j = Σ_{i=j}^{P−1} a_ij, the column sums of the
// prompt's exact causal weights; C = [0, P); evict(P − 1).
// Step t ≥ P: A_t = C ∪ {t}; row t attends A_t with its exact logits (w = 1); then acc_j += a^{(t)}_j, the
// step's weights renormalised over A_t (acc_t starts at 0), C = A_t, evict(t).
// evict(t): while |C| > heavy + window − 1, keep the window − 1 newest keys [t − window + 2, t] and the heavy
// best others by acc (ties keep the older key); the evicted keys and their scores are forgotten.
// This is the real-drop cache H2OKVCache_LayerWise(hh_size = heavy, recent_size = window − 1): `window` counts
// the query's own key, so |A_t| = heavy + window once full. Per query head (share=head, the reference's MHA form),
// or one cache per kv group (share=group) scored by the group's mean, max or sum (agg=logit) of the heads' column
// sums and step weights. heavy + window − 1 ≥ N never evicts: exact.
// A biased selection: the error is the tail of the dropped keys. Deterministic; needs the prompt's query rows.
// Cost: O(P²·p) for the prefill column sums, then O(|A_t|·(p + pv)) a step with an O(|A_t|) eviction.
#include <cstdint>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

struct H2oParams {
  int64_t heavy = 128;         ///< heavy hitters kept beyond the window, by accumulated attention; the samples knob
  int64_t window = 128;        ///< the newest keys attended, the query's own included (the reference's recent_size + 1)
  Share share = Share::kHead;  ///< the reference is multi-head: one cache per query head
  Aggregate agg = Aggregate::kMean;
};

}  // namespace attnprobe
