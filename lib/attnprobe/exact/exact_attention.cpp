#include "attnprobe/exact/exact_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attnprobe {

namespace {
// Query rows per task and keys per online-softmax step. 128 × 512 float scores = 256 KiB, in L2
// with the query block and accumulator. Measured with `attnprobe bench --threads 1` at n = 1024 and
// 4096 (GFLOP/s): 64×512 97/95, 128×512 106/102, 128×256 101/99, 96×1024 102/100, 256×256 100/103.
constexpr int64_t kQueryBlock = 128;
constexpr int64_t kKeyBlock = 512;
// The float64 reference forms whole score rows per block; 32 rows keeps 32 × 4096 doubles in L2.
constexpr int64_t kReferenceBlock = 32;

using MapF = Eigen::Map<MatrixF, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstMapF = Eigen::Map<const MatrixF, Eigen::Unaligned, Eigen::OuterStride<>>;
}  // namespace

MatrixD attention_rows_f64(const MatrixD& q, const MatrixD& k, double scale, int64_t r0, int64_t rows, Mask mask) {
  MatrixD a = scale * (q.middleRows(r0, rows) * k.transpose());
  for (int64_t i = 0; i < a.rows(); ++i) {
    const int64_t seen = visible_keys(r0 + i, k.rows(), mask);
    auto row = a.row(i).head(seen);
    row.array() = (row.array() - row.maxCoeff()).exp();
    row /= row.sum();
    a.row(i).tail(k.rows() - seen).setZero();
  }
  return a;
}

void gemm_abt(int m, int n, int kdim, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
              float* c, int ldc) {
  ConstMapF A(a, m, kdim, Eigen::OuterStride<>(lda));
  ConstMapF B(b, n, kdim, Eigen::OuterStride<>(ldb));
  MapF C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0.0f)
    C.noalias() = alpha * A * B.transpose();
  else
    C = beta * C + alpha * A * B.transpose();
}

void gemm_ab(int m, int n, int kdim, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
             float* c, int ldc) {
  ConstMapF A(a, m, kdim, Eigen::OuterStride<>(lda));
  ConstMapF B(b, kdim, n, Eigen::OuterStride<>(ldb));
  MapF C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0.0f)
    C.noalias() = alpha * A * B;
  else
    C = beta * C + alpha * A * B;
}

MatrixD exact_attention_f64(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale, ThreadPool* pool,
                            Mask mask) {
  const int64_t n = q.rows();
  MatrixD out(n, v.cols());
  const int64_t blocks = (n + kReferenceBlock - 1) / kReferenceBlock;
  auto run_block = [&](int64_t block) {
    const int64_t r0 = block * kReferenceBlock;
    const int64_t rows = std::min(kReferenceBlock, n - r0);
    // Under a causal mask the block's last row sees keys 0..r0 + rows − 1: no later key is touched.
    const int64_t keys = visible_keys(r0 + rows - 1, k.rows(), mask);
    MatrixD scores = scale * (q.middleRows(r0, rows) * k.topRows(keys).transpose());
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t seen = visible_keys(r0 + i, keys, mask);
      auto row = scores.row(i).head(seen);
      row.array() = (row.array() - row.maxCoeff()).exp();
      row /= row.sum();
      scores.row(i).tail(keys - seen).setZero();
    }
    out.middleRows(r0, rows).noalias() = scores * v.topRows(keys);
  };
  for_each_index(pool, blocks, run_block);
  return out;
}

void exact_attention_f32(const MatrixF& q, const MatrixF& k, const MatrixF& v, float scale, MatrixF& out,
                         ThreadPool* pool, Mask mask) {
  const int64_t n = q.rows(), keys = k.rows(), p = q.cols(), pv = v.cols();
  out.resize(n, pv);
  const int64_t blocks = (n + kQueryBlock - 1) / kQueryBlock;
  auto run_block = [&](int64_t block) {
    // Eigen-allocated (64-byte aligned) so that vectorised exp and row sums split every row the
    // same way whichever thread runs the block: malloc'd buffers differ in alignment per thread,
    // and with them the last bits of the result.
    thread_local MatrixF score_buffer;
    thread_local std::vector<float> max_buffer, sum_buffer;
    const int64_t r0 = block * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, n - r0);
    score_buffer.resize(kQueryBlock, kKeyBlock);
    max_buffer.assign(rows, -std::numeric_limits<float>::infinity());
    sum_buffer.assign(rows, 0.0f);
    auto acc = out.middleRows(r0, rows);
    acc.setZero();
    // Causal: key blocks past the block's last query are skipped and the diagonal block is cut at
    // it, so about half the pairs are computed; inside it, keys j > i are set to −inf (weight 0).
    const int64_t block_keys = visible_keys(r0 + rows - 1, keys, mask);
    for (int64_t c0 = 0; c0 < block_keys; c0 += kKeyBlock) {
      const int64_t cols = std::min(kKeyBlock, block_keys - c0);
      Eigen::Map<MatrixF> scores(score_buffer.data(), rows, cols);
      gemm_abt(static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(p), scale, q.data() + r0 * p,
               static_cast<int>(p), k.data() + c0 * p, static_cast<int>(p), 0.0f, scores.data(),
               static_cast<int>(cols));
      if (mask == Mask::kCausal && c0 + cols > r0 + 1)
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t first_masked = std::clamp<int64_t>(r0 + i + 1 - c0, 0, cols);
          scores.row(i).tail(cols - first_masked).setConstant(-std::numeric_limits<float>::infinity());
        }
      for (int64_t i = 0; i < rows; ++i) {
        const float block_max = scores.row(i).maxCoeff();
        const float new_max = std::max(max_buffer[i], block_max);
        const float correction = std::exp(max_buffer[i] - new_max);  // exp(-inf) = 0 on the first block
        scores.row(i).array() = (scores.row(i).array() - new_max).exp();
        sum_buffer[i] = sum_buffer[i] * correction + scores.row(i).sum();
        if (correction != 1.0f) acc.row(i) *= correction;
        max_buffer[i] = new_max;
      }
      gemm_ab(static_cast<int>(rows), static_cast<int>(pv), static_cast<int>(cols), 1.0f, scores.data(),
              static_cast<int>(cols), v.data() + c0 * pv, static_cast<int>(pv), 1.0f, acc.data(), static_cast<int>(pv));
    }
    for (int64_t i = 0; i < rows; ++i) acc.row(i) /= sum_buffer[i];
  };
  for_each_index(pool, blocks, run_block);
}

}  // namespace attnprobe
