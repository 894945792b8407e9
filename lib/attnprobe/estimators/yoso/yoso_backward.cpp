// YOSO's backward pass: the exact YOSO-E gradient, the paper's lower bound, its m-hash estimate and
// the sparse §1.4 form (yoso_backward.h has the formulas). All float64; none forms n × n: the dense
// forms work in blocks of query rows, the LSH form in bucket tables, the sparse form pair by pair.
#include "attnprobe/estimators/yoso/yoso_backward.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

double collision_weight(double x, int tau) {  // (1 − θ/π)^τ
  return std::pow(1.0 - std::acos(std::clamp(x, -1.0, 1.0)) / std::numbers::pi, tau);
}

// The keys of one hash grouped by code: `order` lists key indices sorted by code, `codes` the
// distinct codes and `starts` where each begins in `order` (starts.back() = keys).
struct Buckets {
  std::vector<int64_t> order, starts;
  std::vector<uint32_t> codes;

  Buckets(const std::vector<uint32_t>& all_codes, int64_t rows, int m, int f) : order(rows) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return all_codes[a * m + f] < all_codes[b * m + f]; });
    for (int64_t idx = 0; idx < rows; ++idx) {
      const uint32_t c = all_codes[order[idx] * m + f];
      if (codes.empty() || codes.back() != c) {
        codes.push_back(c);
        starts.push_back(idx);
      }
    }
    starts.push_back(rows);
  }
  /// The bucket of `code`, or −1 when no row has it.
  int64_t find(uint32_t code) const {
    auto it = std::lower_bound(codes.begin(), codes.end(), code);
    return it != codes.end() && *it == code ? it - codes.begin() : -1;
  }
};

}  // namespace

Gradients yoso_expectation_gradient(const MatrixD& q_hat, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g,
                                    int tau, bool lower_bound, Mask mask) {
  const int64_t n = q_hat.rows(), keys = k_hat.rows();
  Gradients out;
  out.q.resize(n, q_hat.cols());
  out.v = MatrixD::Zero(keys, v.cols());
  out.pair_fraction = 1.0;
  for (int64_t r0 = 0; r0 < n; r0 += kExpectationGradientRows) {
    const int64_t rows = std::min(kExpectationGradientRows, n - r0);
    const int64_t cols = visible_keys(r0 + rows - 1, keys, mask);                    // causal: no later key is touched
    const MatrixD x = q_hat.middleRows(r0, rows) * k_hat.topRows(cols).transpose();  // rows × cols
    MatrixD coefficient = g.middleRows(r0, rows) * v.topRows(cols).transpose();      // G·Vᵀ, then ⊙ dW/dx
    MatrixD w(rows, cols);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t seen = visible_keys(r0 + i, cols, mask);
      for (int64_t j = 0; j < seen; ++j) {
        const double c = std::clamp(x(i, j), -1.0, 1.0);
        const double base = 1.0 - std::acos(c) / std::numbers::pi;
        w(i, j) = std::pow(base, tau);
        double derivative;
        if (lower_bound) {
          derivative = 0.5 * tau * w(i, j);
        } else {
          const double sine = std::max(std::sqrt((1.0 - c) * (1.0 + c)), kMinSine);
          derivative = tau * std::pow(base, tau - 1) / (std::numbers::pi * sine);
        }
        coefficient(i, j) *= derivative;
      }
      w.row(i).tail(cols - seen).setZero();
      coefficient.row(i).tail(cols - seen).setZero();
    }
    out.q.middleRows(r0, rows).noalias() = coefficient * k_hat.topRows(cols);
    out.v.topRows(cols).noalias() += w.transpose() * g.middleRows(r0, rows);
  }
  return out;
}

Gradients yoso_lsh_gradient(const std::vector<uint32_t>& query_codes, const std::vector<uint32_t>& key_codes, int m,
                            int tau, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g, Mask mask) {
  const int64_t n = g.rows(), keys = k_hat.rows(), p = k_hat.cols(), pv = v.cols();
  Gradients out;
  out.q = MatrixD::Zero(n, p);
  out.v = MatrixD::Zero(keys, pv);
  MatrixD sums, g_sums;
  std::vector<int64_t> bucket_of_key(keys);
  for (int f = 0; f < m; ++f) {
    // T_f[c] = Σ_j v_j k̂_jᵀ (pv × p, stored as one row of pv·p) per occupied bucket.
    const Buckets by_key(key_codes, keys, m, f);
    const int64_t buckets = static_cast<int64_t>(by_key.codes.size());
    for (int64_t b = 0; b < buckets; ++b)
      for (int64_t idx = by_key.starts[b]; idx < by_key.starts[b + 1]; ++idx) bucket_of_key[by_key.order[idx]] = b;
    const auto add_key = [&](int64_t j) {
      Eigen::Map<MatrixD> table(sums.row(bucket_of_key[j]).data(), pv, p);
      table.noalias() += v.row(j).transpose() * k_hat.row(j);
    };
    // Queries read them, ∇_Q̂_i += g_iᵀ·T_f[h_f(q̂_i)], once the keys query i sees are in: all of them
    // (full), or keys 0..i, added in token order (causal).
    sums.setZero(buckets, pv * p);
    int64_t added = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (const int64_t seen = visible_keys(i, keys, mask); added < seen; ++added) add_key(added);
      const int64_t b = by_key.find(query_codes[i * m + f]);
      if (b >= 0) out.q.row(i).noalias() += g.row(i) * Eigen::Map<const MatrixD>(sums.row(b).data(), pv, p);
    }
    // ∇_V_j += the sum of g_i over the queries that see key j in its bucket: all of them (full), or
    // i ≥ j, the queries added from the last token back (causal).
    g_sums.setZero(buckets, pv);
    const auto add_query = [&](int64_t i) {
      const int64_t b = by_key.find(query_codes[i * m + f]);
      if (b >= 0) g_sums.row(b) += g.row(i);
    };
    if (mask == Mask::kCausal) {
      for (int64_t i = n - 1; i >= 0; --i) {
        add_query(i);
        if (i < keys) out.v.row(i) += g_sums.row(bucket_of_key[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) add_query(i);
      for (int64_t j = 0; j < keys; ++j) out.v.row(j) += g_sums.row(bucket_of_key[j]);
    }
  }
  out.q *= 0.5 * tau / m;
  out.v /= m;
  return out;
}

Gradients yoso_sparse_gradient(const std::vector<uint32_t>& query_codes, const std::vector<uint32_t>& key_codes, int m,
                               int tau, const MatrixD& q_hat, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g,
                               Mask mask) {
  const int64_t n = q_hat.rows(), keys = k_hat.rows();
  std::vector<Buckets> by_key;
  by_key.reserve(m);
  for (int f = 0; f < m; ++f) by_key.emplace_back(key_codes, keys, m, f);
  Gradients out;
  out.q = MatrixD::Zero(n, q_hat.cols());
  out.v = MatrixD::Zero(keys, v.cols());
  std::vector<int64_t> seen(keys, -1);  // seen[j] = i once pair (i, j) is counted: each pair once
  int64_t pairs = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int f = 0; f < m; ++f) {
      const int64_t b = by_key[f].find(query_codes[i * m + f]);
      if (b < 0) continue;
      for (int64_t idx = by_key[f].starts[b]; idx < by_key[f].starts[b + 1]; ++idx) {
        const int64_t j = by_key[f].order[idx];
        if (j >= visible_keys(i, keys, mask)) break;  // a bucket lists its keys in token order
        if (seen[j] == i) continue;
        seen[j] = i;
        ++pairs;
        const double w = collision_weight(q_hat.row(i).dot(k_hat.row(j)), tau);
        out.q.row(i) += (0.5 * tau * w * g.row(i).dot(v.row(j))) * k_hat.row(j);
        out.v.row(j) += w * g.row(i);
      }
    }
  double visible_pairs = 0;
  for (int64_t i = 0; i < n; ++i) visible_pairs += static_cast<double>(visible_keys(i, keys, mask));
  out.pair_fraction = static_cast<double>(pairs) / std::max(visible_pairs, 1.0);
  return out;
}

}  // namespace attnprobe
