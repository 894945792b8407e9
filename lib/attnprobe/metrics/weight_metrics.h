#pragma once
// Attention-weight metrics (docs/metrics.md): how far the attention matrix Â an estimator implies
// is from the exact A = softmax(s·QKᵀ), row by row: does it find the right keys (top-k recall) even
// when its output is off, or does it smear attention (total variation, KL)? O(n²·p) for A and
// whatever Â costs, in row blocks: never n × n at once.
#include <vector>

#include "attnprobe/estimators/estimator.h"
#include "attnprobe/metrics/catalogue.h"

namespace attnprobe {

/// row_tv = mean_i ½·Σ_j |Â_ij − A_ij|; row_kl = mean_i Σ_j A_ij·log(A_ij / max(Â′_ij, 1e-30)) with
/// Â′ the row clamped at 0 and renormalised (a zero row stays zero); topk_recall = mean_i
/// |top-k(Â_i) ∩ top-k(A_i)| / k, k = min(8, keys), ties to the lower index. Values in the order of
/// `which` (weight metrics only).
std::vector<double> attention_weight_metrics(const HeadView& view, const Estimator::WeightRows& implied,
                                             const std::vector<Metric>& which);

}  // namespace attnprobe
