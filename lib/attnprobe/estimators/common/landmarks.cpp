#include "attnprobe/estimators/common/landmarks.h"

#include <algorithm>
#include <type_traits>

#include "attnprobe/common/error.h"

namespace attnprobe {

std::vector<Segment> contiguous_segments(int64_t n, int64_t count) {
  const int64_t c = std::min(count, n);
  const int64_t base = n / c, longer = n % c;  // the last `longer` segments get one more token
  std::vector<Segment> out;
  out.reserve(c);
  int64_t start = 0;
  for (int64_t s = 0; s < c; ++s) {
    const int64_t length = base + (s >= c - longer ? 1 : 0);
    out.push_back(Segment{start, length});
    start += length;
  }
  return out;
}

namespace {
template <typename Input>
MatrixD segment_means_of(const Input& x, const std::vector<Segment>& segments, ThreadPool* pool,
                         VectorD* row_squared_norms) {
  MatrixD out = MatrixD::Zero(static_cast<int64_t>(segments.size()), x.cols());
  if (row_squared_norms != nullptr) {
    // Only the segments' rows get a norm: they must be every row (keys as many as queries, as every view has).
    const int64_t covered = segments.empty() ? 0 : segments.back().start + segments.back().length;
    require_usage(covered == x.rows(),
                  "segment_means: the segments cover {} of {} rows, and every row's norm is asked for", covered,
                  x.rows());
    row_squared_norms->resize(x.rows());
  }
  // Row by row along contiguous memory: a colwise() reduction over the row-major block strided down
  // every column (10% of a Nyström call at n = 4096). Eight segments per pool item: a segment can be a
  // handful of rows (L = 256), less work than claiming an item.
  constexpr int64_t kSegmentsPerItem = 8;
  const int64_t count = static_cast<int64_t>(segments.size());
  for_each_index(pool, (count + kSegmentsPerItem - 1) / kSegmentsPerItem, [&](int64_t item) {
    for (int64_t s = item * kSegmentsPerItem; s < std::min(count, (item + 1) * kSegmentsPerItem); ++s) {
      const Segment& segment = segments[s];
      auto mean = out.row(s);
      if constexpr (std::is_same_v<typename Input::Scalar, float>) {
        add_rows_f64(x.row(segment.start).data(), x.cols(), segment.length, x.cols(), mean.data());
        // The segment's rows were just read (256 KiB at n = 65536, C = 64, p = 64): still in the core's L2.
        if (row_squared_norms != nullptr)
          for (int64_t r = segment.start; r < segment.start + segment.length; ++r)
            (*row_squared_norms)(r) = squared_norm_f64(x.row(r).data(), x.cols());
      } else {
        for (int64_t r = segment.start; r < segment.start + segment.length; ++r) mean += x.row(r);
      }
      mean /= static_cast<double>(segment.length);
    }
  });
  return out;
}
}  // namespace

MatrixD segment_means(const MatrixD& x, const std::vector<Segment>& segments, ThreadPool* pool) {
  return segment_means_of(x, segments, pool, nullptr);
}
MatrixD segment_means(const MatrixF& x, const std::vector<Segment>& segments, ThreadPool* pool,
                      VectorD* row_squared_norms) {
  return segment_means_of(x, segments, pool, row_squared_norms);
}

namespace {
template <typename Matrix>
void softmax_rows_in_place(Matrix& logits) {
  for (int64_t i = 0; i < logits.rows(); ++i) {
    auto row = logits.row(i);
    row.array() = (row.array() - row.maxCoeff()).exp();
    row /= row.sum();
  }
}
}  // namespace

void softmax_rows(MatrixD& logits) { softmax_rows_in_place(logits); }
void softmax_rows(MatrixF& logits) { softmax_rows_in_place(logits); }

}  // namespace attnprobe
