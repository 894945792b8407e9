#pragma once
// A small-GEMM kernel for the products inside attention blocks (score blocks of 128 × 512, tiles of a
// projection), where Eigen's GEMM, built for large matrices (packing, cache blocking), reached ~60% of
// what these shapes allow. With AVX-512: blocks of 6 rows × 64 columns, 24 accumulators kept in
// registers (GCC left them on the stack unless the loops are unrolled: 43 GFLOP/s), x's row loaded once
// per 6 rows and broadcast-FMA'd with e's entries. Measured on one Zen 4 core (fp32 peak ~110 GFLOP/s),
// E·K and E·V at n = 16384, d = 256: Eigen 67 GFLOP/s, this kernel 114–116 (4-row blocks: 97–104).
#include <cstdint>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

/// out (rows × width, leading dimension ldo) = e (rows × cols, lde) · x (cols × width, ldx), row-major
/// floats, overwriting out (no pass zeroing it first). Each element is one chain in t order from zero
/// (with AVX-512 the kernel above, without it a loop the compiler vectorises), so a row's bits do not
/// depend on which rows are computed with it (the decode rows' property). Callers that sum several products keep each
/// in its own buffer (see exact_attention.cpp: one chain per key block, not one over all n keys).
void tile_product_assign(const float* e, int64_t lde, int64_t rows, int64_t cols, const float* x, int64_t ldx,
                         int64_t width, float* out, int64_t ldo);

/// A row-major float block (a matrix, middleRows of one, or a block with an outer stride).
using ConstRowBlockF = Eigen::Ref<const MatrixF, 0, Eigen::OuterStride<>>;

/// out = a·b (a.rows() × b.cols(), resized) with tile_product_assign: for the products of estimators'
/// row blocks (a: rows × k, b: k × width with width a multiple of 16 at best; pass Bᵀ's transpose
/// made once per call, not per block).
void tile_product(ConstRowBlockF a, ConstRowBlockF b, MatrixF& out);

/// out = scale·aᵀ (a.cols() × a.rows(), resized): the transposed operand the tile products want (keys of
/// a chunk, feature blocks). With AVX-512 in 16 × 16 register blocks; Eigen's transposed assignment
/// gathered 4 floats at a time (~10% of a LARA or Nyström call). Each entry is one multiplication, as
/// `scale * a.transpose()`: the same bits.
void transpose_scaled(ConstRowBlockF a, float scale, MatrixF& out);

}  // namespace attnprobe
