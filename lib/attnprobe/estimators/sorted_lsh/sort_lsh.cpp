#include "attnprobe/estimators/sorted_lsh/sort_lsh.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "attnprobe/estimators/yoso/lsh.h"

namespace attnprobe {

uint32_t bucket_sort_key(uint32_t code, BucketOrder order) {
  if (order == BucketOrder::kCode) return code ^ (code >> 1);
  uint32_t rank = code;  // inverse Gray code: prefix XOR of the bits from the top
  for (uint32_t shift = 1; shift < 32; shift <<= 1) rank ^= rank >> shift;
  return rank;
}

namespace {

// Sorted order of n items by (sort key of the code, index) and the block of each item.
void sort_into_blocks(const std::vector<uint32_t>& codes, BucketOrder order, int64_t block,
                      std::vector<int64_t>& sorted, std::vector<int64_t>& block_of) {
  const int64_t n = static_cast<int64_t>(codes.size());
  std::vector<uint32_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = bucket_sort_key(codes[i], order);
  sorted.resize(n);
  std::iota(sorted.begin(), sorted.end(), 0);
  std::stable_sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  block_of.resize(n);
  for (int64_t pos = 0; pos < n; ++pos) block_of[sorted[pos]] = pos / block;
}

}  // namespace

SortLshBlocks sort_lsh_blocks(const MatrixD& q, const MatrixD& k, int bits, int64_t block, BucketOrder order,
                              RandomKey key, ThreadPool* pool) {
  SortLshBlocks out;
  out.block = block;
  std::vector<uint32_t> q_codes(q.rows(), 0), k_codes(k.rows(), 0);
  if (bits > 0) {  // lsh_codes draws the same r projections for both calls (same key, m = 1, tau = r)
    q_codes = lsh_codes(q, 1, bits, LshKind::kGauss, key, pool);
    k_codes = lsh_codes(k, 1, bits, LshKind::kGauss, key, pool);
  }
  for_each_index(pool, 2, [&](int64_t side) {  // the two sorts are independent
    if (side == 0)
      sort_into_blocks(q_codes, order, block, out.query_order, out.query_block);
    else
      sort_into_blocks(k_codes, order, block, out.key_order, out.key_block);
  });
  return out;
}

template <typename S>
void block_plus_samples(const SliceData<S>& data, double scale, const SortLshBlocks& blocks,
                        const std::vector<int64_t>& samples, const std::vector<double>& sample_weights, bool mask,
                        MatrixT<S>& out, VectorD* log_denominator, ThreadPool* pool, Precision stored) {
  const int64_t n = data.q.rows(), pv = data.v.cols(), m = static_cast<int64_t>(samples.size());
  const S s = static_cast<S>(scale);
  out.resize(n, pv);
  if (log_denominator) log_denominator->resize(n);
  const MatrixT<S> k_sampled = data.k(samples, Eigen::all), v_sampled = data.v(samples, Eigen::all);  // m × p, m × pv
  const RowVectorT<S> weights = Eigen::Map<const VectorD>(sample_weights.data(), m).cast<S>().transpose();
  // Each block's rows are independent of the others: blocks run on the pool. Both parts of a block are
  // contracted with V as two products over the block (one matrix–vector product per row was a quarter of
  // a kdeformer call).
  for_each_index(pool, blocks.blocks(), [&](int64_t g) {
    const int64_t begin = blocks.begin(g), rows = blocks.end(g) - begin;
    const std::vector<int64_t> queries(blocks.query_order.begin() + begin, blocks.query_order.begin() + begin + rows);
    const std::vector<int64_t> keys(blocks.key_order.begin() + begin, blocks.key_order.begin() + begin + rows);
    const MatrixT<S> q_block = data.q(queries, Eigen::all);
    MatrixT<S> block_logits = s * (q_block * data.k(keys, Eigen::all).transpose());  // rows × rows
    MatrixT<S> sample_logits = s * (q_block * k_sampled.transpose());                // rows × m
    // Masked samples (their key sits in this block) get logit −∞: out of the row max, weight exactly 0.
    RowVectorT<S> keep(m);
    for (int64_t u = 0; u < m; ++u) keep(u) = !mask || blocks.key_block[samples[u]] != g ? S(1) : S(0);
    VectorT<S> denominator(rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t u = 0; u < m; ++u)
        if (keep(u) == 0) sample_logits(r, u) = -std::numeric_limits<S>::infinity();
      const S shift = m > 0 ? std::max(block_logits.row(r).maxCoeff(), sample_logits.row(r).maxCoeff())
                            : block_logits.row(r).maxCoeff();
      block_logits.row(r).array() = (block_logits.row(r).array() - shift).exp();
      sample_logits.row(r).array() = (sample_logits.row(r).array() - shift).exp() * weights.array();
      denominator(r) = block_logits.row(r).sum() + sample_logits.row(r).sum();
      if (log_denominator)
        (*log_denominator)(queries[r]) = static_cast<double>(shift) + std::log(double(denominator(r)));
    }
    if constexpr (std::is_same_v<S, float>) {
      round_in_place(block_logits, stored);
      round_in_place(sample_logits, stored);
    }
    MatrixT<S> numerator = block_logits * data.v(keys, Eigen::all);  // rows × pv
    if (m > 0) numerator.noalias() += sample_logits * v_sampled;
    for (int64_t r = 0; r < rows; ++r) out.row(queries[r]) = numerator.row(r) / denominator(r);
  });
}

template void block_plus_samples<float>(const SliceData<float>&, double, const SortLshBlocks&,
                                        const std::vector<int64_t>&, const std::vector<double>&, bool, MatrixT<float>&,
                                        VectorD*, ThreadPool*, Precision);
template void block_plus_samples<double>(const SliceData<double>&, double, const SortLshBlocks&,
                                         const std::vector<int64_t>&, const std::vector<double>&, bool,
                                         MatrixT<double>&, VectorD*, ThreadPool*, Precision);

MatrixD block_plus_samples_rows(const MatrixD& q, const MatrixD& k, double scale, const SortLshBlocks& blocks,
                                const std::vector<int64_t>& samples, const std::vector<double>& sample_weights,
                                bool mask, int64_t r0, int64_t rows) {
  MatrixD w = scale * (q.middleRows(r0, rows) * k.transpose());  // logits, rows × keys
  VectorD count(k.rows());                                       // c_ij for one row
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t g = blocks.query_block[r0 + r];
    count.setZero();
    for (int64_t t = blocks.begin(g); t < blocks.end(g); ++t) count(blocks.key_order[t]) += 1.0;
    for (size_t u = 0; u < samples.size(); ++u)
      if (!mask || blocks.key_block[samples[u]] != g) count(samples[u]) += sample_weights[u];
    double shift = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < k.rows(); ++j)
      if (count(j) > 0) shift = std::max(shift, w(r, j));
    for (int64_t j = 0; j < k.rows(); ++j) w(r, j) = count(j) > 0 ? count(j) * std::exp(w(r, j) - shift) : 0.0;
    w.row(r) /= w.row(r).sum();
  }
  return w;
}

}  // namespace attnprobe
