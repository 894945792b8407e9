#pragma once
// Matrix conventions, stated once: every matrix is row-major, one token per row
// (Q, K: n × p, V: n × pv, outputs: n × pv). Row-major keeps score blocks and softmax rows
// contiguous (a column-major row softmax at n = 4096 is ~10× slower, docs/performance.md).
// Eigen/Core only: the few files that factor a matrix include the module they use (Eigen/Eigenvalues, Eigen/SVD,
// …), so that the other translation units do not parse the decompositions.
#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <utility>

namespace attnprobe {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorF = Eigen::VectorXf;
using VectorD = Eigen::VectorXd;
using RowVectorF = Eigen::RowVectorXf;
using RowVectorD = Eigen::RowVectorXd;

/// The (row, column) of the first NaN or infinity of a block in row-major order, or {-1, -1} when every
/// value is finite. x − x is 0 exactly for a finite x, so one vectorised sum decides the common case; the
/// element-by-element search runs only on failure.
template <typename Block>
std::pair<Eigen::Index, Eigen::Index> first_non_finite(const Block& x) {
  if ((x - x).sum() == 0) return {-1, -1};
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j)
      if (!std::isfinite(x(i, j))) return {i, j};
  return {-1, -1};
}

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

namespace detail {
/// add_rows_f64's kernel for one panel of exactly `Width` columns (a compile-time count, so that the running
/// sums are a fixed array the compiler keeps in vector registers across the rows).
template <int Width, bool Squares>
void add_panel_rows_f64(const float* x, Eigen::Index ld, Eigen::Index rows, double* sum, double* squares) {
  double s[Width], q[Squares ? Width : 1];
  for (int c = 0; c < Width; ++c) s[c] = sum[c];
  if constexpr (Squares)
    for (int c = 0; c < Width; ++c) q[c] = squares[c];
  for (Eigen::Index r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
    for (int c = 0; c < Width; ++c) s[c] += static_cast<double>(row[c]);
    if constexpr (Squares)
      for (int c = 0; c < Width; ++c) q[c] += static_cast<double>(row[c]) * static_cast<double>(row[c]);
  }
  for (int c = 0; c < Width; ++c) sum[c] = s[c];
  if constexpr (Squares)
    for (int c = 0; c < Width; ++c) squares[c] = q[c];
}
}  // namespace detail

/// sum_c += Σ_r x_rc and, when `squares` is given, squares_c += Σ_r x_rc², in float64, over `rows` float32
/// rows of `cols` values `ld` apart: the column statistics of a slice (segment means, mean(V), FAVOR++'s
/// column sums). Each column's terms are added in row order, one after another, so the bits are those of a
/// plain row-by-row loop (and of Eigen's `sum += x.row(r).cast<double>()`). The running sums stay in
/// registers, 128 columns at a time (64 with the squares): Eigen's loop loaded and stored the float64 sum
/// row for every float32 row it added, and ran at half the memory's speed. Segment means of Q and K at
/// n = 65536, p = 64, one Zen 5 core, in a scratch benchmark: 1.43 → 0.78 ms (p = 128: 3.4 → 1.7 ms).
/// Columns past the panels take the plain loop.
inline void add_rows_f64(const float* x, Eigen::Index ld, Eigen::Index rows, Eigen::Index cols, double* sum,
                         double* squares = nullptr) {
  Eigen::Index c0 = 0;
  if (squares != nullptr) {
    for (; c0 + 64 <= cols; c0 += 64) detail::add_panel_rows_f64<64, true>(x + c0, ld, rows, sum + c0, squares + c0);
  } else {
    for (; c0 + 128 <= cols; c0 += 128) detail::add_panel_rows_f64<128, false>(x + c0, ld, rows, sum + c0, nullptr);
    for (; c0 + 64 <= cols; c0 += 64) detail::add_panel_rows_f64<64, false>(x + c0, ld, rows, sum + c0, nullptr);
  }
  if (c0 == cols) return;
  for (Eigen::Index r = 0; r < rows; ++r)
    for (Eigen::Index c = c0; c < cols; ++c) {
      const double value = x[r * ld + c];
      sum[c] += value;
      if (squares != nullptr) squares[c] += value * value;
    }
}

/// Σ term(x_i) over count float32 values, accumulated in float64 in eight partial sums (x_i in lane i % 8)
/// added at the end: one vector register of doubles. Eigen's reduction of a cast<double>() expression runs
/// one scalar at a time, ~8× slower (0.6 ms of a LARA call at n = 16384). The order depends on count only,
/// so the bits are those of any thread.
template <typename Term>
double lane_sum_f64(const float* x, Eigen::Index count, Term term) {
  double lanes[8] = {};
  Eigen::Index i = 0;
  for (; i + 8 <= count; i += 8)
    for (int lane = 0; lane < 8; ++lane) lanes[lane] += term(static_cast<double>(x[i + lane]));
  for (int lane = 0; i < count; ++i, ++lane) lanes[lane] += term(static_cast<double>(x[i]));
  double total = 0;
  for (double lane : lanes) total += lane;
  return total;
}
/// Σ x_i² and Σ x_i in float64 (lane_sum_f64).
inline double squared_norm_f64(const float* x, Eigen::Index count) {
  return lane_sum_f64(x, count, [](double v) { return v * v; });
}
inline double sum_f64(const float* x, Eigen::Index count) {
  return lane_sum_f64(x, count, [](double v) { return v; });
}

}  // namespace attnprobe
