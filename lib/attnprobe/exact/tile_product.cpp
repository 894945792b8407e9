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
    for (int v = 0; v < kVecs; ++v)
      acc[r][v] = _mm512_maskz_loadu_ps(v == kVecs - 1 ? last : 0xFFFF, out + r * ldo + 16 * v);
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
#endif

}  // namespace

void tile_product_add(const float* e, int64_t lde, int64_t rows, int64_t cols, const float* x, int64_t ldx,
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
  using Map = Eigen::Map<MatrixF, Eigen::Unaligned, Eigen::OuterStride<> >;
  using ConstMap = Eigen::Map<const MatrixF, Eigen::Unaligned, Eigen::OuterStride<> >;
  Map(out, rows, width, Eigen::OuterStride<>(ldo)).noalias() +=
      ConstMap(e, rows, cols, Eigen::OuterStride<>(lde)) * ConstMap(x, cols, width, Eigen::OuterStride<>(ldx));
#endif
}

void tile_product(ConstRowBlockF a, ConstRowBlockF b, MatrixF& out) {
  out.setZero(a.rows(), b.cols());
  tile_product_add(a.data(), a.outerStride(), a.rows(), a.cols(), b.data(), b.outerStride(), b.cols(), out.data(),
                   out.cols());
}

}  // namespace attnprobe
