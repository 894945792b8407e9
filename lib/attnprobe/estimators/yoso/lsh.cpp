#include "attnprobe/estimators/yoso/lsh.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "attnprobe/common/error.h"
#include "attnprobe/exact/tile_product.h"
#include "attnprobe/rng/random_matrix.h"

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

namespace {
// Bit j of positive: projections[j] > 0; of unsure: not above near_zero[j] in absolute value (NaN included),
// for j < width; the words past width are zero.
void sign_bits(const float* projections, const float* near_zero, int64_t width, uint64_t* positive, uint64_t* unsure) {
  const int64_t words = (width + 63) / 64;
  std::fill(positive, positive + words, 0);
  std::fill(unsure, unsure + words, 0);
  int64_t j = 0;
#if defined(__AVX512F__)
  for (; j < width; j += 16) {  // 16 projections per compare, their bits shifted into place
    const __mmask16 lanes = width - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (width - j)) - 1);
    const __m512 value = _mm512_maskz_loadu_ps(lanes, projections + j);
    const __m512 bound = _mm512_maskz_loadu_ps(lanes, near_zero + j);
    const uint64_t above = _mm512_mask_cmp_ps_mask(lanes, value, _mm512_setzero_ps(), _CMP_GT_OQ);
    const uint64_t near = _mm512_mask_cmp_ps_mask(lanes, _mm512_abs_ps(value), bound, _CMP_NGT_UQ);
    positive[j / 64] |= above << (j % 64);
    unsure[j / 64] |= near << (j % 64);
  }
#endif
  for (; j < width; ++j) {
    positive[j / 64] |= static_cast<uint64_t>(projections[j] > 0) << (j % 64);
    unsure[j / 64] |= static_cast<uint64_t>(!(std::abs(projections[j]) > near_zero[j])) << (j % 64);
  }
}

// Bits offset … offset + τ − 1 of a bit array as a code (bit b of the code = bit offset + b), as sign_code
// makes it from the projections; bits may span two words (both within the array: offset + τ ≤ its width).
uint32_t code_bits(const uint64_t* bits, int64_t offset, int tau) {
  const int64_t word = offset / 64, shift = offset % 64;
  uint64_t value = bits[word] >> shift;
  if (shift + tau > 64) value |= bits[word + 1] << (64 - shift);
  return static_cast<uint32_t>(value & ((uint64_t{1} << tau) - 1));
}
}  // namespace

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
    // The bound in float, rounded up: a projection above it is above the float64 bound too; one that is
    // not (or NaN) takes the float64 dot product, whose sign a float32 projection this far from 0 shares.
    std::vector<float> near_zero(width);
    for (int64_t j = 0; j < width; ++j) {
      const double bound = 4.0 * (p + 2) * std::ldexp(1.0, -24) * r.row(j).norm();
      near_zero[j] = static_cast<float>(bound);
      if (near_zero[j] < bound) near_zero[j] = std::nextafter(near_zero[j], INFINITY);
    }
    const int64_t words = (width + 63) / 64;
    const int64_t block = 256;
    for_each_index(pool, (n + block - 1) / block, [&](int64_t b) {
      thread_local MatrixF unit_rows, projections;
      thread_local std::vector<uint64_t> positive, unsure;
      const int64_t r0 = b * block, rows = std::min(block, n - r0);
      unit_rows.resize(rows, p);
      for (int64_t i = 0; i < rows; ++i) {
        const double norm = x.row(r0 + i).norm();
        unit_rows.row(i) = (x.row(r0 + i) / (norm > 0 ? norm : 1.0)).cast<float>();
      }
      tile_product(unit_rows, r_t, projections);  // rows × (m·τ)
      positive.resize(words);
      unsure.resize(words);
      for (int64_t i = 0; i < rows; ++i) {
        // Bits, not a double per projection: the per-projection select took longer than the projections.
        sign_bits(projections.row(i).data(), near_zero.data(), width, positive.data(), unsure.data());
        for (int64_t w = 0; w < words; ++w)
          for (uint64_t left = unsure[w]; left != 0; left &= left - 1) {
            const int64_t j = 64 * w + __builtin_ctzll(left);
            const uint64_t bit = uint64_t{1} << (j & 63);
            positive[w] = x.row(r0 + i).dot(r.row(j)) > 0 ? positive[w] | bit : positive[w] & ~bit;
          }
        for (int f = 0; f < m; ++f) codes[(r0 + i) * m + f] = code_bits(positive.data(), int64_t{f} * tau, tau);
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
