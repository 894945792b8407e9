// YOSO's backward pass: the exact YOSO-E gradient, the paper's lower bound, its m-hash estimate and
// the sparse §1.4 form (yoso_backward.h has the formulas). All float64; none forms n × n: the dense
// forms work in blocks of query rows, the LSH form in bucket tables, the sparse form pair by pair.
#include "attnprobe/estimators/yoso/yoso_backward.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

namespace attnprobe {
namespace {

constexpr int64_t kRowBlock = 256;

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
                                    int tau, bool lower_bound) {
  const int64_t n = q_hat.rows(), keys = k_hat.rows();
  Gradients out;
  out.q.resize(n, q_hat.cols());
  out.v = MatrixD::Zero(keys, v.cols());
  out.pair_fraction = 1.0;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, n - r0);
    const MatrixD x = q_hat.middleRows(r0, rows) * k_hat.transpose();  // rows × keys
    MatrixD coefficient = g.middleRows(r0, rows) * v.transpose();      // G·Vᵀ, then ⊙ dW/dx
    MatrixD w(rows, keys);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < keys; ++j) {
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
    out.q.middleRows(r0, rows).noalias() = coefficient * k_hat;
    out.v.noalias() += w.transpose() * g.middleRows(r0, rows);
  }
  return out;
}

Gradients yoso_lsh_gradient(const std::vector<uint32_t>& query_codes, const std::vector<uint32_t>& key_codes, int m,
                            int tau, const MatrixD& k_hat, const MatrixD& v, const MatrixD& g) {
  const int64_t n = g.rows(), keys = k_hat.rows(), p = k_hat.cols(), pv = v.cols();
  Gradients out;
  out.q = MatrixD::Zero(n, p);
  out.v = MatrixD::Zero(keys, pv);
  MatrixD sums, g_sums;
  for (int f = 0; f < m; ++f) {
    // Keys fill T_f[c] = Σ_j v_j k̂_jᵀ (pv × p, stored as one row of pv·p) per occupied bucket.
    const Buckets by_key(key_codes, keys, m, f);
    const int64_t buckets = static_cast<int64_t>(by_key.codes.size());
    sums.setZero(buckets, pv * p);
    for (int64_t b = 0; b < buckets; ++b) {
      Eigen::Map<MatrixD> table(sums.row(b).data(), pv, p);
      for (int64_t idx = by_key.starts[b]; idx < by_key.starts[b + 1]; ++idx) {
        const int64_t j = by_key.order[idx];
        table.noalias() += v.row(j).transpose() * k_hat.row(j);
      }
    }
    // Queries read them: ∇_Q̂_i += g_iᵀ·T_f[h_f(q̂_i)]; and fill the sums of g for ∇_V.
    g_sums.setZero(buckets, pv);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = by_key.find(query_codes[i * m + f]);
      if (b < 0) continue;
      out.q.row(i).noalias() += g.row(i) * Eigen::Map<const MatrixD>(sums.row(b).data(), pv, p);
      g_sums.row(b) += g.row(i);
    }
    for (int64_t b = 0; b < buckets; ++b)
      for (int64_t idx = by_key.starts[b]; idx < by_key.starts[b + 1]; ++idx)
        out.v.row(by_key.order[idx]) += g_sums.row(b);
  }
  out.q *= 0.5 * tau / m;
  out.v /= m;
  return out;
}

Gradients yoso_sparse_gradient(const std::vector<uint32_t>& query_codes, const std::vector<uint32_t>& key_codes, int m,
                               int tau, const MatrixD& q_hat, const MatrixD& k_hat, const MatrixD& v,
                               const MatrixD& g) {
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
        if (seen[j] == i) continue;
        seen[j] = i;
        ++pairs;
        const double w = collision_weight(q_hat.row(i).dot(k_hat.row(j)), tau);
        out.q.row(i) += (0.5 * tau * w * g.row(i).dot(v.row(j))) * k_hat.row(j);
        out.v.row(j) += w * g.row(i);
      }
    }
  out.pair_fraction =
      static_cast<double>(pairs) / (static_cast<double>(n) * static_cast<double>(std::max<int64_t>(keys, 1)));
  return out;
}

}  // namespace attnprobe
