#pragma once
// Landmarks as contiguous-segment means (Nyströmformer, LARA; docs/estimators/nystrom.md): the n positions are
// split into C contiguous segments; when C does not divide n the first segments are one shorter;
// when n ≤ C every token is its own segment.
#include <cstdint>
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

/// Row-wise softmax of `logits` in place (row max subtracted), in the matrix's precision.
void softmax_rows(MatrixD& logits);
void softmax_rows(MatrixF& logits);

}  // namespace attnprobe
