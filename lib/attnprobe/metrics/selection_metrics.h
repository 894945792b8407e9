#pragma once
// Selection metrics (docs/metrics.md, "Selection metrics"): what the keys a selection estimator reads cost and
// keep, per evaluated row against the exact weights a over the keys V_t the row sees, then the mean over rows.
// O(n_q·n_k·p) for a, in row blocks.
#include <vector>

#include "attnprobe/estimators/estimator.h"
#include "attnprobe/metrics/catalogue.h"

namespace attnprobe {

/// keys_attended = |S_t|; keys_scored (the method's count); reps_attended = the row's completion terms; density = |S_t|
/// / |V_t|; density_scored = keys_scored / |V_t|; mass_recall m = Σ_{S_t} a_j; for a selection (no log-weights):
/// tail_mass = 1 − m, tail_gap = ‖μ_T − μ_S‖ (μ_S = Σ_S a_j v_j / m, μ_T = Σ_{V_t∖S} a_j v_j / (1 − m), 0 when m = 1),
/// tail_pred = (1 − m)·tail_gap (= ‖o_t − ô_t‖) and row_kl_rev = −log m (= KL(Â‖A)); NaN for sampled keys with weights.
/// For those (a method whose rows carry log-weights ω_j, Horvitz–Thompson or Hansen–Hurwitz corrections, or
/// completion terms: no renormalised selection) instead: den_rel = |D̂/D − 1| with
/// D̂/D = Σ_S a_j·e^{ω_j} + Σ_c e^{λ_c}/D, num_rel = ‖N̂ − N‖/‖N‖ with N̂/D = Σ_S a_j·e^{ω_j}·v_j + Σ_c (e^{λ_c}/D)·u_c,
/// eps_cover = the fraction of rows with ‖ô − o‖ ≤ ε‖o‖ (ô = N̂/D̂; ε = the row's own KeptKeys::eps when the method
/// states one, else `eps`, the --eps option) and pilot = the mean of KeptKeys::pilot; NaN for a selection.
/// kept_overlap = |S_t ∩ O_t| / |S_t ∪ O_t| with O_t the |S_t| heaviest keys (the size-matched oracle), or, given
/// `reference_kept` (the case's --reference is a selection estimator), O_t = that estimator's kept set of the row:
/// method against method on the same case; kept_overlap_a = |S_t ∩ O_t| / |S_t| (1 for an empty S_t), the share of
/// the row's keys that O_t holds too (against the oracle 2J/(1 + J) of the Jaccard J; against a larger reference, 1
/// when S_t ⊆ O_t). topk_recall@K =
/// |S_t ∩ Top_K(a_t)| / min(K, |V_t|) with K = `recall_k` (--recall-k), ties to the lower index. Below float32
/// (`kept` from the rounded inputs and scores, `view` the inputs as stored): kept_overlap_f32 = |S_t ∩ F_t| /
/// |S_t ∪ F_t| with F_t the same method's float32 kept set of the row, `float32_kept` (1 when it is null: a float32
/// case is its own), score_ties = Σ tied / Σ ranked scores and cut_ties = the share of rankings whose cut fell inside
/// a tie, pooled over the rows' ScoreTies (NaN when no ranking dropped a key below float32). Values in the order of
/// `which` (selection metrics only).
std::vector<double> selection_metrics(const HeadView& view, const Estimator::KeptRows& kept,
                                      const std::vector<Metric>& which, double eps = 0.05,
                                      int64_t recall_k = kDefaultRecallK,
                                      const Estimator::KeptRows* reference_kept = nullptr,
                                      const Estimator::KeptRows* float32_kept = nullptr);

}  // namespace attnprobe
