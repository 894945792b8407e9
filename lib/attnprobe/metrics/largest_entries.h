#pragma once
// The ranking the weight and selection metrics share: the largest entries of a row of weights, with
// one tie rule (the lower index first, i.e. the older key), so that topk_recall, kept_overlap and
// topk_recall@K agree about which keys are "the k heaviest".
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

/// The indices in [begin, end) of the `count` largest entries of `row` (at most end − begin), larger
/// first, ties to the lower index. One partial sort: callers that need several k take prefixes.
inline std::vector<int64_t> largest_entries(const Eigen::Ref<const RowVectorD>& row, int64_t begin, int64_t end,
                                            int64_t count) {
  std::vector<int64_t> order(static_cast<size_t>(end - begin));
  for (int64_t j = begin; j < end; ++j) order[static_cast<size_t>(j - begin)] = j;
  count = std::min(count, end - begin);
  std::partial_sort(order.begin(), order.begin() + count, order.end(),
                    [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  order.resize(static_cast<size_t>(count));
  return order;
}

}  // namespace attnprobe
