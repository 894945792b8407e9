#pragma once
// quest(page, budget, last, round, min_pages) — Quest's query-aware page selection (docs/estimators/selection.md).
// Target: softmax. The keys a row sees are cut into pages of `page` keys aligned to key 0 (the edges partial);
// each page carries its channel-wise minimum m_b and maximum M_b over its keys, and the row scores it by the upper
// bound U_b = Σ_d max(q_d·M_bd, q_d·m_bd) ≥ max_{j∈page} q·k_j (equal at page = 1). With b_t = min(budget, |V_t|)
// it keeps n = ⌈b_t/page⌉ pages (round=floor: ⌊b_t/page⌋, the reference's, not exact when page ∤ |V_t|), at least
// min_pages and at most all (and all when round=ceil and budget ≥ |V_t|: a window's keys can straddle one page
// more than they fill): the n best by U_b (last=0: the evaluation code behind the paper's numbers), or the
// page holding the query plus the n − 1 best others (last=1: the kernel's). Ties to the older page; w = 1.
// share=group ranks the competing pages by the kv group's aggregate of s·U_b (sharing.h; default logit: the sum,
// sparse-frontier's share_pages). keys_scored: 2 per page (its min and max). last=1 needs positions.
#include <cstdint>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

enum class QuestRound { kCeil, kFloor };

struct QuestParams {
  int64_t page = 16;
  int64_t budget = 256;  ///< keys the pages should hold (the samples knob)
  bool last = false;     ///< the query's own page always, plus the n − 1 best others
  QuestRound round = QuestRound::kCeil;
  int64_t min_pages = 3;
  Share share = Share::kHead;         ///< Quest's evaluation code repeats K per query head
  Aggregate agg = Aggregate::kLogit;  ///< sparse-frontier's shared pages sum the heads' page scores
};

}  // namespace attnprobe
