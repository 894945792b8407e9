// The tile product of tile_product.h (see there for the measurements).
#include "attnprobe/exact/tile_product.h"

#include <algorithm>

#include "attnprobe/common/matrix.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attnprobe {
namespace {
#if defined(__AVX512F__)
template <int kRows, int kVecs>
void tile_product_block(const float* e, int64_t lde, int64_t cols, const float* x, int64_t ldx, float* out, int64_t ldo,
                        __mmask16 last) {
  __m512 acc[kRows][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < cols; ++t) {
    __m512 xv[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) xv[v] = _mm512_maskz_loadu_ps(v == kVecs - 1 ? last : 0xFFFF, x + t * ldx + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 b = _mm512_set1_ps(e[r * lde + t]);
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_fmadd_ps(b, xv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v)
      _mm512_mask_storeu_ps(out + r * ldo + 16 * v, v == kVecs - 1 ? last : 0xFFFF, acc[r][v]);
}

template <int kRows>
void tile_product_rows(int vecs, const float* e, int64_t lde, int64_t cols, const float* x, int64_t ldx, float* out,
                       int64_t ldo, __mmask16 last) {
  switch (vecs) {
    case 1:
      return tile_product_block<kRows, 1>(e, lde, cols, x, ldx, out, ldo, last);
    case 2:
      return tile_product_block<kRows, 2>(e, lde, cols, x, ldx, out, ldo, last);
    case 3:
      return tile_product_block<kRows, 3>(e, lde, cols, x, ldx, out, ldo, last);
    default:
      return tile_product_block<kRows, 4>(e, lde, cols, x, ldx, out, ldo, last);
  }
}

// dst (16 × 16, leading dimension ldd) = scale·srcᵀ (16 × 16, lds): 16 rows in registers, pairs of rows
// interleaved within 128-bit lanes (unpack ps), then pairs of pairs (unpack pd) — lane k of u[4i + j]
// holds column 4k + j of rows 4i..4i+3 — then the lanes gathered across the four row groups.
void transpose16(const float* src, int64_t lds, float scale, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  auto lo = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  auto hi = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = lo(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
  }
  const __m512 factor = _mm512_set1_ps(scale);
  for (int j = 0; j < 4; ++j) {
    const __m512 even01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88),
                 odd01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    const __m512 even23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88),
                 odd23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    _mm512_storeu_ps(dst + j * ldd, _mm512_mul_ps(factor, _mm512_shuffle_f32x4(even01, even23, 0x88)));
    _mm512_storeu_ps(dst + (4 + j) * ldd, _mm512_mul_ps(factor, _mm512_shuffle_f32x4(odd01, odd23, 0x88)));
    _mm512_storeu_ps(dst + (8 + j) * ldd, _mm512_mul_ps(factor, _mm512_shuffle_f32x4(even01, even23, 0xdd)));
    _mm512_storeu_ps(dst + (12 + j) * ldd, _mm512_mul_ps(factor, _mm512_shuffle_f32x4(odd01, odd23, 0xdd)));
  }
}
#endif

}  // namespace

void transpose_scaled(ConstRowBlockF a, float scale, MatrixF& out) {
  const int64_t rows = a.rows(), cols = a.cols(), lda = a.outerStride();
  out.resize(cols, rows);
  const float* src = a.data();
  float* dst = out.data();
  int64_t r0 = 0;
#if defined(__AVX512F__)
  for (; r0 + 16 <= rows; r0 += 16) {
    int64_t c0 = 0;
    for (; c0 + 16 <= cols; c0 += 16) transpose16(src + r0 * lda + c0, lda, scale, dst + c0 * rows + r0, rows);
    for (; c0 < cols; ++c0)
      for (int64_t r = r0; r < r0 + 16; ++r) dst[c0 * rows + r] = scale * src[r * lda + c0];
  }
#endif
  for (; r0 < rows; ++r0)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r0] = scale * src[r0 * lda + c];
}

#if !defined(__AVX512F__)
namespace {
// kRows rows of out = e·x, each element summed over t in order (see tile_product_assign).
template <int kRows>
void tile_product_rows_portable(const float* e, int64_t lde, int64_t cols, const float* x, int64_t ldx, int64_t width,
                                float* out, int64_t ldo) {
  for (int r = 0; r < kRows; ++r) std::fill(out + r * ldo, out + r * ldo + width, 0.0f);
  for (int64_t t = 0; t < cols; ++t) {
    const float* x_row = x + t * ldx;
    for (int r = 0; r < kRows; ++r) {
      const float a = e[r * lde + t];
      float* __restrict__ o = out + r * ldo;
      for (int64_t c = 0; c < width; ++c) o[c] += a * x_row[c];
    }
  }
}
}  // namespace
#endif

void tile_product_assign(const float* e, int64_t lde, int64_t rows, int64_t cols, const float* x, int64_t ldx,
                         int64_t width, float* out, int64_t ldo) {
#if defined(__AVX512F__)
  for (int64_t c0 = 0; c0 < width; c0 += 64) {
    const int64_t w = std::min<int64_t>(64, width - c0);
    const int vecs = static_cast<int>((w + 15) / 16);
    const __mmask16 last = w % 16 == 0 ? 0xFFFF : static_cast<__mmask16>((1u << (w % 16)) - 1);
    // Blocks of 6 rows, then at most one of 4, 2 and 1: the result does not depend on the blocking.
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6)
      tile_product_rows<6>(vecs, e + r * lde, lde, cols, x + c0, ldx, out + r * ldo + c0, ldo, last);
    if (r + 4 <= rows) {
      tile_product_rows<4>(vecs, e + r * lde, lde, cols, x + c0, ldx, out + r * ldo + c0, ldo, last);
      r += 4;
    }
    if (r + 2 <= rows) {
      tile_product_rows<2>(vecs, e + r * lde, lde, cols, x + c0, ldx, out + r * ldo + c0, ldo, last);
      r += 2;
    }
    if (r < rows) tile_product_rows<1>(vecs, e + r * lde, lde, cols, x + c0, ldx, out + r * ldo + c0, ldo, last);
  }
#else
  // Each element one chain in t order from zero here too, vectorised by the compiler across the width, 4 rows
  // sharing each row of x. Eigen's GEMM sums in an order that depends on a row's place among the rows
  // computed with it, so the last rows of a slice alone would not give the bits of the whole slice's.
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    tile_product_rows_portable<4>(e + r * lde, lde, cols, x, ldx, width, out + r * ldo, ldo);
  for (; r < rows; ++r) tile_product_rows_portable<1>(e + r * lde, lde, cols, x, ldx, width, out + r * ldo, ldo);
#endif
}

void tile_product(ConstRowBlockF a, ConstRowBlockF b, MatrixF& out) {
  out.resize(a.rows(), b.cols());
  tile_product_assign(a.data(), a.outerStride(), a.rows(), a.cols(), b.data(), b.outerStride(), b.cols(), out.data(),
                      out.cols());
}

}  // namespace attnprobe
