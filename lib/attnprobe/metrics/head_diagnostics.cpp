#include "attnprobe/metrics/head_diagnostics.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {

namespace {

constexpr int64_t kRowBlock = 256;
constexpr int kPowerIterations = 30;

// Keys StreamingLLM keeps as attention sinks: the first four tokens of the cache.
constexpr int64_t kSinkKeys = 4;

// Rows [r0, r0 + rows) of A under the view's mask and query positions; `max_logit` gets the block's largest
// s·q_i·k_j over the keys each row sees.
MatrixD attention_rows(const HeadView& view, int64_t r0, int64_t rows, double* max_logit = nullptr) {
  if (max_logit) {
    const MatrixD logits = view.scale * (view.q.middleRows(r0, rows) * view.k.transpose());
    *max_logit = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < rows; ++i) {
      const KeyRange seen = view.visible(r0 + i);
      *max_logit = std::max(*max_logit, logits.row(i).segment(seen.begin, seen.size()).maxCoeff());
    }
  }
  return attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.geometry(), &view.shaping);
}

double row_entropy(const Eigen::Ref<const Eigen::RowVectorXd>& row) {
  return -(row.array() * (row.array() > 0).select(row.array().log(), 0.0)).sum();
}

double norm_cv(const MatrixD& x) {
  const Eigen::VectorXd norms = x.rowwise().norm();
  const double mean = norms.mean();
  return mean == 0 ? 0 : std::sqrt((norms.array() - mean).square().mean()) / mean;
}

// Runs f(b, r0, rows) for every row block b, in parallel over `pool` when given. Callers keep one
// result per block and reduce them in block order, so the result does not depend on the threads.
void for_each_block(int64_t n, ThreadPool* pool, const std::function<void(int64_t, int64_t, int64_t)>& f) {
  const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
  auto one = [&](int64_t b) { f(b, b * kRowBlock, std::min(kRowBlock, n - b * kRowBlock)); };
  for_each_index(pool, blocks, one);
}

}  // namespace

double mean_attention_entropy(const HeadView& view) {
  double total = 0;
  for (int64_t r0 = 0; r0 < view.n(); r0 += kRowBlock) {
    const MatrixD a = attention_rows(view, r0, std::min(kRowBlock, view.n() - r0));
    for (int64_t i = 0; i < a.rows(); ++i) total += row_entropy(a.row(i));
  }
  return total / view.n();
}

const std::vector<std::string>& diagnostic_names() {
  static const std::vector<std::string> kNames = {"entropy",       "effective_support", "max_logit", "stable_rank",
                                                  "mean_distance", "q_norm_cv",         "k_norm_cv", "sink_mass"};
  return kNames;
}

std::vector<double> diagnostic_values(const HeadDiagnostics& d) {
  return {d.entropy,       d.effective_support, d.max_logit, d.stable_rank,
          d.mean_distance, d.q_norm_cv,         d.k_norm_cv, d.sink_mass};
}

HeadDiagnostics diagnose_head(const HeadView& view, ThreadPool* pool) {
  const int64_t n = view.n(), keys = view.keys(), blocks = (n + kRowBlock - 1) / kRowBlock;
  struct RowStats {
    double entropy = 0, support = 0, distance = 0, fro2 = 0, max_logit = 0, sink = 0;
  };
  std::vector<RowStats> parts(blocks);
  for_each_block(n, pool, [&](int64_t b, int64_t r0, int64_t rows) {
    RowStats& s = parts[b];
    const MatrixD a = attention_rows(view, r0, rows, &s.max_logit);
    std::vector<double> sorted(a.cols());
    for (int64_t i = 0; i < a.rows(); ++i) {
      s.entropy += row_entropy(a.row(i));
      std::copy(a.row(i).begin(), a.row(i).end(), sorted.begin());
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      double mass = 0;
      int64_t keys = 0;
      // 0.9 less a rounding margin: 270 weights of 1/300 sum to 0.8999999999999999 in float64.
      while (mass < 0.9 - 1e-12 && keys < a.cols()) mass += sorted[keys++];
      s.support += static_cast<double>(keys);
      const auto position = static_cast<double>(view.position(r0 + i));
      for (int64_t j = 0; j < a.cols(); ++j) s.distance += a(i, j) * std::abs(position - static_cast<double>(j));
      s.fro2 += a.row(i).squaredNorm();
      s.sink += a.row(i).head(std::min(kSinkKeys, keys)).sum();
    }
  });
  HeadDiagnostics d;
  double fro2 = 0;
  d.max_logit = -std::numeric_limits<double>::infinity();
  for (const RowStats& s : parts) {
    d.entropy += s.entropy / n;
    d.effective_support += s.support / n;
    d.mean_distance += s.distance / n;
    d.sink_mass += s.sink / n;
    fro2 += s.fro2;
    d.max_logit = std::max(d.max_logit, s.max_logit);
  }
  // ‖A‖₂² by power iteration on AᵀA (x ← Aᵀ(A x) / ‖·‖) from the all-ones direction: attention
  // rows sum to one, so that start is never orthogonal to the top singular vector.
  Eigen::VectorXd x = Eigen::VectorXd::Ones(keys) / std::sqrt(static_cast<double>(keys));
  double sigma2 = 0;
  std::vector<Eigen::VectorXd> products(blocks);
  for (int it = 0; it < kPowerIterations; ++it) {
    for_each_block(n, pool, [&](int64_t b, int64_t r0, int64_t rows) {
      const MatrixD a = attention_rows(view, r0, rows);
      products[b] = a.transpose() * (a * x);
    });
    Eigen::VectorXd y = Eigen::VectorXd::Zero(keys);
    for (const Eigen::VectorXd& p : products) y += p;
    sigma2 = y.norm();
    if (sigma2 == 0) break;
    x = y / sigma2;
  }
  d.stable_rank = sigma2 > 0 ? fro2 / sigma2 : 0;
  d.q_norm_cv = norm_cv(view.q);
  d.k_norm_cv = norm_cv(view.k);
  return d;
}

}  // namespace attnprobe
