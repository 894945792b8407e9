#include "attnprobe/metrics/weight_metrics.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/largest_entries.h"

namespace attnprobe {

namespace {

constexpr int64_t kRowBlock = 128;
constexpr int64_t kTopK = 8;

// How many of the estimate's top k keys are among the exact row's top k, where a key that ties with the
// exact k-th largest weight counts as among them: two equal keys (a repeated token without positions,
// synthetic duplicates) are equally right answers, and the estimate's rounding picks either. The set
// intersection with ties to the lower index gave exact softmax 0.996 on such rows.
int64_t top_k_found(const Eigen::Ref<const Eigen::RowVectorXd>& exact,
                    const Eigen::Ref<const Eigen::RowVectorXd>& estimate, int64_t k) {
  const double kth_exact = exact[largest_entries(exact, 0, exact.size(), k).back()];
  int64_t found = 0;
  for (int64_t j : largest_entries(estimate, 0, estimate.size(), k)) found += exact[j] >= kth_exact ? 1 : 0;
  return found;
}

// Σ_j a_j·log(a_j / max(â_j, 1e-30)) of one row, â clamped at 0 and renormalised. Both rows are
// distributions, so the KL divergence is ≥ 0 (Gibbs); for â = a it is a rounding residue of either sign
// (±4e-17: the renormalisation divides by a float64 sum of 1 ± ulps), clamped to the 0 it is.
double row_kl(const Eigen::Ref<const Eigen::RowVectorXd>& exact, const Eigen::Ref<const Eigen::RowVectorXd>& estimate) {
  Eigen::RowVectorXd clamped = estimate.array().max(0.0);
  const double total = clamped.sum();
  if (total > 0) clamped /= total;
  double kl = 0;
  for (int64_t j = 0; j < exact.size(); ++j)
    if (exact[j] > 0) kl += exact[j] * std::log(exact[j] / std::max(clamped[j], 1e-30));
  return std::max(kl, 0.0);
}

}  // namespace

std::vector<double> attention_weight_metrics(const HeadView& view, const Estimator::WeightRows& implied,
                                             const std::vector<Metric>& which) {
  if (!implied) throw std::logic_error("attention-weight metrics of an estimator that states no weights");
  const int64_t n = view.n(), keys = view.k.rows();
  double tv = 0, kl = 0, recall = 0;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, n - r0);
    const MatrixD exact = attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.geometry(), &view.shaping);
    const MatrixD estimate = implied(r0, rows);
    if (estimate.rows() != rows || estimate.cols() != keys)
      throw std::logic_error("implied weights of the wrong shape");
    for (int64_t i = 0; i < rows; ++i) {
      tv += 0.5 * (estimate.row(i) - exact.row(i)).cwiseAbs().sum();
      kl += row_kl(exact.row(i), estimate.row(i));
      // Among the keys row i sees (causal: 0..position), k = min(8, their count): a causal row 0 has one key
      // to find.
      const KeyRange seen = view.visible(r0 + i);
      const int64_t k = std::min(kTopK, seen.size());
      const int64_t found = top_k_found(exact.row(i).segment(seen.begin, seen.size()),
                                        estimate.row(i).segment(seen.begin, seen.size()), k);
      recall += static_cast<double>(found) / k;
    }
  }
  std::vector<double> values;
  for (Metric m : which) {
    switch (m) {
      case Metric::kRowTv:
        values.push_back(tv / n);
        break;
      case Metric::kRowKl:
        values.push_back(kl / n);
        break;
      case Metric::kTopkRecall:
        values.push_back(recall / n);
        break;
      default:
        throw std::logic_error("attention_weight_metrics asked for a metric that is not one");
    }
  }
  return values;
}

}  // namespace attnprobe
