#pragma once
// snapkv(window, budget, kernel, pool) — SnapKV: the prompt's cache compressed once by the votes of its last
// `window` query rows (docs/estimators/selection.md). Target: softmax. Class B: the decode rows of a slice cut
// with --queries last:W come after a prompt of P = N − W tokens. The observation rows O = [P − window, P) vote
// with their exact causal weights, v_j = Σ_{i∈O} softmax_{j' ≤ i}(s·q_i·k_j')_j, for the candidates
// j < P − window; the votes are pooled over a window of `kernel` keys (avg: zero-padded, divided by kernel as
// avg_pool1d with count_include_pad; max: the in-range maximum); the budget − window best candidates (ties to
// the older key) and O form K_P, or every prompt key when P ≤ budget. Row t ≥ P attends K_P ∪ [P, t] (w = 1).
// share=head selects per query head (the original repeats K/V per head); share=group aggregates the pooled votes
// over the kv group first (kvpress: agg=mean).
// Deterministic; needs the prompt's query rows (HeadView::prompt_qf) and P > window (else exit 3).
// Cost: window·P·p votes once per call, then |S_t|·(p + pv) per row.
#include <cstdint>
#include <vector>

#include "attnprobe/estimators/selection/sharing.h"

namespace attnprobe {

enum class SnapkvPool { kAvg, kMax };

struct SnapkvParams {
  int64_t window = 32;   ///< observation rows at the end of the prompt, kept themselves
  int64_t budget = 256;  ///< prompt keys kept, the window's included
  int64_t kernel = 5;    ///< pooling width (odd)
  SnapkvPool pool = SnapkvPool::kAvg;
  Share share = Share::kHead;  ///< the original repeats K/V per query head; kvpress: group, mean
  Aggregate agg = Aggregate::kMean;
};

/// The votes pooled over `kernel` (odd) neighbours, stride 1, same length: avg sums the in-range ones and
/// divides by kernel (the zero padding counts, as avg_pool1d's count_include_pad); max takes the in-range maximum.
std::vector<double> pool_votes(const std::vector<double>& votes, int64_t kernel, SnapkvPool pool);

}  // namespace attnprobe
