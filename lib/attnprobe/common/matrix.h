#pragma once
// Matrix conventions, stated once: every matrix is row-major, one token per row
// (Q, K: n × p, V: n × pv, outputs: n × pv). Row-major keeps score blocks and softmax rows
// contiguous (a column-major row softmax at n = 4096 is ~10× slower, docs/performance.md).
#include <Eigen/Dense>
#include <limits>

namespace attnprobe {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorF = Eigen::VectorXf;
using VectorD = Eigen::VectorXd;
using RowVectorF = Eigen::RowVectorXf;
using RowVectorD = Eigen::RowVectorXd;

/// Column sums and maxima of a row-major block, accumulated row by row: Eigen's colwise() reductions
/// walk down each column with the row stride, one scalar at a time (a column sum of Performer's 256 × 256
/// feature block was 12% of its call); along the rows they vectorise. The sums add rows 0, 1, … in
/// order, the order of the scalar walk: the same bits.
/// With no rows: zeros and −inf, as Eigen's reductions of an empty column.
template <typename Block>
Eigen::Matrix<typename Block::Scalar, 1, Eigen::Dynamic> column_sums(const Block& x) {
  using Row = Eigen::Matrix<typename Block::Scalar, 1, Eigen::Dynamic>;
  if (x.rows() == 0) return Row::Zero(x.cols());
  Row out = x.row(0);
  for (Eigen::Index r = 1; r < x.rows(); ++r) out += x.row(r);
  return out;
}
template <typename Block>
Eigen::Matrix<typename Block::Scalar, 1, Eigen::Dynamic> column_max(const Block& x) {
  using Row = Eigen::Matrix<typename Block::Scalar, 1, Eigen::Dynamic>;
  if (x.rows() == 0) return Row::Constant(x.cols(), -std::numeric_limits<typename Block::Scalar>::infinity());
  Row out = x.row(0);
  for (Eigen::Index r = 1; r < x.rows(); ++r) out = out.cwiseMax(x.row(r));
  return out;
}

}  // namespace attnprobe
