#pragma once
// tova(budget, heads, mode) — TOVA, Token Omission Via Attention (docs/estimators/selection.md). Target: softmax.
// mode=replay (class C, TOVACache.reduce after every forward): a cache C of at most `budget` keys, scored by the
// current row's weights only (no accumulation across steps).
// Prefill (the prompt's P rows): C = [0, P); if P > budget, C = the budget best of [0, P) by the last prompt row's
// weights a_{P−1,j} (ties keep the older key; the last key may go: TOVA does not force it).
// Step t ≥ P: A_t = C ∪ {t}; row t attends A_t with its exact logits (w = 1); if |A_t| > budget, C = the budget
// best of A_t by this step's weights softmax_{A_t}(s·q_t·k_j) (exactly one key leaves, the new one may), else
// C = A_t. |A_t| = budget + 1 once full; budget ≥ N never evicts: exact.
// mode=prefill (class B, kvpress's TOVAPress: one compression at P): K_P = {P − 1} ∪ the budget − 1 best of
// [0, P − 1) by a_{P−1,j} (softmax over all P keys), or [0, P) when P ≤ budget; row t ≥ P attends K_P ∪ [P, t].
// Needs P > 0.
// heads=layer (default, the reference's TOVACache): one cache of key positions for the whole layer, scored by the
// mean over all H query heads of their weights, each head's over its own kv head's keys (every kv head keeps the
// same positions); heads=group: one cache per kv group, the mean over its G heads; heads=head: one per query head.
// Outside a sweep a view is its own group of one (heads=head). A biased selection: the error is the tail of the
// dropped keys. Deterministic; needs the prompt's query rows.
// Cost: O(P·p) for the last prompt row, then O(|A_t|·(p + pv)) a step with an O(|A_t|) eviction.
#include <cstdint>

namespace attnprobe {

enum class TovaMode { kReplay, kPrefill };
enum class TovaHeads { kLayer, kGroup, kHead };

struct TovaParams {
  int64_t budget = 256;  ///< cached keys after each step (replay) or prompt keys kept (prefill); the samples knob
  TovaHeads heads = TovaHeads::kLayer;
  TovaMode mode = TovaMode::kReplay;
};

}  // namespace attnprobe
