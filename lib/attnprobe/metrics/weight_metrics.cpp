#include "attnprobe/metrics/weight_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {

namespace {

constexpr int64_t kRowBlock = 128;
constexpr int64_t kTopK = 8;

// The indices of the k largest entries of a row, larger first, ties to the lower index.
std::vector<int64_t> top_k(const Eigen::Ref<const Eigen::RowVectorXd>& row, int64_t k) {
  std::vector<int64_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace

std::vector<double> attention_weight_metrics(const HeadView& view, const Estimator::WeightRows& implied,
                                             const std::vector<Metric>& which) {
  if (!implied) throw std::logic_error("attention-weight metrics of an estimator that states no weights");
  const int64_t n = view.n(), keys = view.k.rows();
  double tv = 0, kl = 0, recall = 0;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, n - r0);
    const MatrixD exact = attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.mask);
    const MatrixD estimate = implied(r0, rows);
    if (estimate.rows() != rows || estimate.cols() != keys)
      throw std::logic_error("implied weights of the wrong shape");
    for (int64_t i = 0; i < rows; ++i) {
      const auto a = exact.row(i).array();
      const auto w = estimate.row(i).array();
      tv += 0.5 * (w - a).abs().sum();
      Eigen::ArrayXd clamped = w.max(0.0).transpose();
      const double total = clamped.sum();
      if (total > 0) clamped /= total;
      for (int64_t j = 0; j < keys; ++j)
        if (a[j] > 0) kl += a[j] * std::log(a[j] / std::max(clamped[j], 1e-30));
      // Among the keys row i sees (causal: 0..i), k = min(8, their count): a causal row 0 has one key to find.
      const int64_t seen = visible_keys(r0 + i, keys, view.mask), k = std::min(kTopK, seen);
      const std::vector<int64_t> top_exact = top_k(exact.row(i).head(seen), k),
                                 top_estimate = top_k(estimate.row(i).head(seen), k);
      std::vector<int64_t> common;
      std::set_intersection(top_exact.begin(), top_exact.end(), top_estimate.begin(), top_estimate.end(),
                            std::back_inserter(common));
      recall += static_cast<double>(common.size()) / k;
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
