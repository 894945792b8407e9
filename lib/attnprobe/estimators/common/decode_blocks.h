#pragma once
// Row blocks for decode forms: an estimator that works on blocks of query rows gives the last rows of a slice
// evaluated alone (a decode step) the very bits of the whole slice's only if each row meets the same
// arithmetic. Eigen's products do not promise a row the same additions for every row count (a one-row product
// is a matrix–vector or dot product; a GEMM's rows depend on the block's shape), so blocks are cut at
// multiples of the block size in absolute position, and a first block that starts inside one gets zero rows
// in front: the block then has the shape it has in the whole slice (the last rows end where its blocks end).
#include <algorithm>
#include <cstdint>

namespace attnprobe {

struct AlignedBlock {
  int64_t rows = 0;  ///< evaluated rows in the block
  int64_t lead = 0;  ///< zero rows put in front of them
};

/// The block of the evaluated rows from one at absolute `position`, with `remaining` rows left: up to the next
/// multiple of `block` positions (self-attention: `block` rows from 0, no lead).
inline AlignedBlock aligned_block(int64_t position, int64_t remaining, int64_t block) {
  const int64_t lead = position % block;
  return {std::min(block - lead, remaining), lead};
}

/// Rows [r0, r0 + rows) of x with `lead` zero rows in front.
template <class Matrix>
Matrix with_lead(const Matrix& x, int64_t r0, int64_t rows, int64_t lead) {
  Matrix out(lead + rows, x.cols());
  out.topRows(lead).setZero();
  out.bottomRows(rows) = x.middleRows(r0, rows);
  return out;
}

}  // namespace attnprobe
