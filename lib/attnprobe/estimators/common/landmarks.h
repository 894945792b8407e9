#pragma once
// Landmarks as contiguous-segment means (Nyströmformer, LARA; docs/estimators/nystrom.md): the n positions are
// split into C contiguous segments; when C does not divide n the first segments are one shorter;
// when n ≤ C every token is its own segment.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"

namespace attnprobe {

struct Segment {
  int64_t start = 0, length = 0;
};

/// min(count, n) segments covering [0, n) in order.
std::vector<Segment> contiguous_segments(int64_t n, int64_t count);

/// Row c = mean of the rows of segment c (segments × cols). With a pool, segments are spread over its
/// threads (each mean summed by one thread in row order: the same bits).
MatrixD segment_means(const MatrixD& x, const std::vector<Segment>& segments, ThreadPool* pool = nullptr);
/// The same from the float32 copy of the inputs, summed in float64 (add_rows_f64): the same bits whenever x
/// holds values a float32 represents exactly (every dump stored as float32, bf16 or fp16), and half the
/// memory read (the float64 means were 10–14% of a LARA or Nyström(64) call at n = 4096). For the
/// float32 estimates, whose other products read the float32 copy too. `row_squared_norms`, when given,
/// is resized to x.rows() and receives each row's ‖x_r‖² (squared_norm_f64), taken while the segment is in
/// the cache: LARA's key bias then costs no pass over the keys of its own (at n = 65536 they are read from
/// memory, 0.6 ms of a 25 ms call).
MatrixD segment_means(const MatrixF& x, const std::vector<Segment>& segments, ThreadPool* pool = nullptr,
                      VectorD* row_squared_norms = nullptr);

/// Every row of out (resized to rows × v.cols(); rows < 0: v.rows()) = the mean of v's rows: uniform
/// attention over every key, the one-segment landmark (vmean's estimate and reference, Informer's lazy rows).
/// The mean is summed in float64 along contiguous rows (a float sum over thousands of rows loses ~1e-5
/// relative; colwise().mean() strided down each column; add_rows_f64 for float32 values) in sum_row_groups'
/// fixed groups, then each row of out is written once, in blocks on the pool (zeroing out and adding the mean
/// wrote it twice; replicate() stored one element at a time).
template <class Values, class Out>
void mean_rows(const Values& v, Out& out, ThreadPool* pool = nullptr, int64_t rows = -1) {
  const int64_t keys = v.rows(), n = rows < 0 ? keys : rows;
  const RowVectorD sum = sum_row_groups<RowVectorD>(
      pool, keys, RowVectorD::Zero(v.cols()), [&](int64_t begin, int64_t end, RowVectorD& part) {
        if constexpr (std::is_same_v<typename Values::Scalar, float>)
          add_rows_f64(v.row(begin).data(), v.outerStride(), end - begin, v.cols(), part.data());
        else
          for (int64_t i = begin; i < end; ++i) part += v.row(i);
      });
  const auto mean = (sum / static_cast<double>(keys)).template cast<typename Out::Scalar>().eval();
  out.resize(n, v.cols());
  constexpr int64_t kFillRows = 1024;
  for_each_index(pool, (n + kFillRows - 1) / kFillRows, [&](int64_t b) {
    for (int64_t i = b * kFillRows; i < std::min(n, (b + 1) * kFillRows); ++i) out.row(i) = mean;
  });
}

/// Row-wise softmax of `logits` in place (row max subtracted), in the matrix's precision.
void softmax_rows(MatrixD& logits);
void softmax_rows(MatrixF& logits);

}  // namespace attnprobe
