#pragma once
// Selection metrics (docs/metrics.md, "Selection metrics"): what the keys a selection estimator reads cost and
// keep, per evaluated row against the exact weights a over the keys V_t the row sees, then the mean over rows.
// O(n_q·n_k·p) for a, in row blocks.
#include <vector>

#include "attnprobe/estimators/estimator.h"
#include "attnprobe/metrics/catalogue.h"

namespace attnprobe {

/// keys_attended = |S_t|; keys_scored (the method's count); density = |S_t| / |V_t|; density_scored =
/// keys_scored / |V_t|; mass_recall m = Σ_{S_t} a_j; for a selection (no log-weights): tail_mass = 1 − m,
/// tail_gap = ‖μ_T − μ_S‖ (μ_S = Σ_S a_j v_j / m, μ_T = Σ_{V_t∖S} a_j v_j / (1 − m), 0 when m = 1), tail_pred =
/// (1 − m)·tail_gap (= ‖o_t − ô_t‖) and row_kl_rev = −log m (= KL(Â‖A)); NaN for sampled keys with weights.
/// Values in the order of `which` (selection metrics only).
std::vector<double> selection_metrics(const HeadView& view, const Estimator::KeptRows& kept,
                                      const std::vector<Metric>& which);

}  // namespace attnprobe
