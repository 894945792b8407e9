#include "attnprobe/estimators/yoso/lsh.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {

MatrixD normalize_rows(const MatrixD& x) {
  MatrixD out = x;
  for (int64_t i = 0; i < out.rows(); ++i) {
    const double norm = out.row(i).norm();
    if (norm > 0) out.row(i) /= norm;
  }
  return out;
}

void yoso_inputs(const MatrixD& q, const MatrixD& k, bool lift, MatrixD& q_hat, MatrixD& k_hat) {
  if (!lift) {
    q_hat = normalize_rows(q);
    k_hat = normalize_rows(k);
    return;
  }
  const int64_t p = q.cols();
  const double big = std::max(q.rowwise().norm().maxCoeff(), k.rowwise().norm().maxCoeff());
  const double inv = big > 0 ? 1.0 / big : 0.0;
  auto lifted = [&](const MatrixD& x, int64_t slot) {
    MatrixD out = MatrixD::Zero(x.rows(), p + 2);
    out.leftCols(p) = x * inv;
    for (int64_t i = 0; i < x.rows(); ++i)
      out(i, p + slot) = big > 0 ? std::sqrt(std::max(0.0, big * big - x.row(i).squaredNorm())) * inv : 0.0;
    return out;
  };
  q_hat = lifted(q, 0);
  k_hat = lifted(k, 1);
}

int hadamard_sign(const RandomStream& stream, uint32_t part, uint32_t d, uint32_t c) {
  return stream.sign(part * 3 + d, c);  // the GPU kernel draws the same: gpu/lsh.cu
}

std::vector<uint32_t> lsh_codes(const MatrixD& x, int m, int tau, LshKind kind, RandomKey key, ThreadPool* pool) {
  if (tau < 1 || tau > 30) throw InputError(fmt::format("yoso: tau = {} must be in 1..30", tau));
  const int64_t n = x.rows(), p = x.cols();
  std::vector<uint32_t> codes(static_cast<size_t>(n) * m, 0);
  if (kind == LshKind::kGauss) {
    const RandomStream stream(key, Purpose::kHashProjection);
    const MatrixD r = normal_rows(stream, static_cast<int64_t>(m) * tau, p);
    // A code is the signs of x·r_j, which float32 gets right except within its rounding of 0. So the
    // projections run in float32 on the tile kernel, of rows scaled to unit norm (a sign ignores the scale,
    // and float32 then cannot overflow), and every projection within a bound of 0 is taken again as the
    // float64 dot product: |float32 − exact| ≤ (p + 2)·2⁻²⁴·‖r_j‖ for a unit row (the inputs' rounding and p
    // multiply-adds), and the bound below is 4 times that. Codes are those of the float64 projections
    // unless one lies within ~1e-16·‖x‖·‖r_j‖ of 0 (the float64 path's own rounding, as on the GPU); the
    // float64 GEMM took a quarter of a YOSO call. Row blocks keep the block × (m·τ) projections in cache
    // (the whole n × (m·τ) matrix is 32 MiB at n = 16384, m = 32, τ = 8; streaming it made hashing
    // superlinear in n).
    const int64_t width = r.rows();
    const MatrixF r_t = r.cast<float>().transpose();  // p × (m·τ)
    const VectorD near_zero = (4.0 * (p + 2) * std::ldexp(1.0, -24)) * r.rowwise().norm();
    const int64_t block = 256;
    for_each_index(pool, (n + block - 1) / block, [&](int64_t b) {
      thread_local MatrixF unit_rows, projections;
      thread_local std::vector<double> signs;
      const int64_t r0 = b * block, rows = std::min(block, n - r0);
      unit_rows.resize(rows, p);
      for (int64_t i = 0; i < rows; ++i) {
        const double norm = x.row(r0 + i).norm();
        unit_rows.row(i) = (x.row(r0 + i) / (norm > 0 ? norm : 1.0)).cast<float>();
      }
      tile_product(unit_rows, r_t, projections);  // rows × (m·τ)
      signs.resize(width);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < width; ++j) {
          const float projection = projections(i, j);
          signs[j] = std::abs(projection) > near_zero(j) ? projection : x.row(r0 + i).dot(r.row(j));
        }
        for (int f = 0; f < m; ++f) codes[(r0 + i) * m + f] = sign_code(&signs[f * tau], tau);
      }
    });
    return codes;
  }
  int64_t padded = 1;
  while (padded < p) padded *= 2;
  if (tau > padded)
    throw InputError(
        fmt::format("yoso(hash=hadamard): tau = {} exceeds the padded head dim {}; use tau <= {} or "
                    "hash=gauss",
                    tau, padded, padded));
  const int per_part = static_cast<int>(padded / tau);
  const int parts = (m + per_part - 1) / per_part;
  const RandomStream stream(key, Purpose::kSignFlip);
  std::vector<double> signs(static_cast<size_t>(3) * padded);
  for (int t = 0; t < parts; ++t) {
    for (int d = 0; d < 3; ++d)
      for (int64_t c = 0; c < padded; ++c)
        signs[d * padded + c] = hadamard_sign(stream, t, d, static_cast<uint32_t>(c));
    // Rows in blocks of 256 per pool item (an item per row made the pool's claiming the bottleneck: 1.6×
    // on two threads).
    const int64_t block = 256;
    for_each_index(pool, (n + block - 1) / block, [&](int64_t b) {
      thread_local std::vector<double> y;
      for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
        y.assign(padded, 0.0);
        for (int64_t c = 0; c < p; ++c) y[c] = x(i, c);
        for (int d = 0; d < 3; ++d) {
          for (int64_t c = 0; c < padded; ++c) y[c] *= signs[d * padded + c];
          fast_walsh_hadamard(y.data(), padded);
        }
        hadamard_part_codes(y.data(), t, per_part, m, tau, codes.data() + i * m);
      }
    });
  }
  return codes;
}

}  // namespace attnprobe
