#include "attnprobe/estimators/common/sparse_support.h"

#include <algorithm>
#include <numeric>

namespace attnprobe {

SparseSupport support_from_rows(std::vector<std::vector<int32_t>> rows) {
  SparseSupport support;
  support.offsets.assign(1, 0);
  for (auto& row : rows) {
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    support.keys.insert(support.keys.end(), row.begin(), row.end());
    support.offsets.push_back(static_cast<int64_t>(support.keys.size()));
  }
  return support;
}

SparseSupport empty_support(int64_t rows) { return support_from_rows(std::vector<std::vector<int32_t>>(rows)); }

namespace {
// Row i: keys [begin(i), end(i)) ∩ [0, keys), already ascending and distinct.
template <class Range>
SparseSupport ranges_support(int64_t rows, int64_t keys, Range range) {
  SparseSupport support;
  support.offsets.assign(1, 0);
  for (int64_t i = 0; i < rows; ++i) {
    const auto [begin, end] = range(i);
    for (int64_t j = std::max<int64_t>(0, begin); j < std::min(end, keys); ++j)
      support.keys.push_back(static_cast<int32_t>(j));
    support.offsets.push_back(static_cast<int64_t>(support.keys.size()));
  }
  return support;
}
}  // namespace

SparseSupport window_support(int64_t rows, int64_t keys, int64_t before, int64_t after) {
  return ranges_support(rows, keys, [&](int64_t i) { return std::pair(i - before, i + after + 1); });
}

SparseSupport block_support(int64_t rows, int64_t keys, int64_t width, int64_t ext) {
  return ranges_support(rows, keys,
                        [&](int64_t i) { return std::pair((i / width) * width - ext, (i / width + 1) * width + ext); });
}

SparseSupport group_support(const std::vector<std::vector<int64_t>>& query_group,
                            const std::vector<std::vector<int64_t>>& key_group, int64_t keys) {
  const int64_t rows = query_group.empty() ? 0 : static_cast<int64_t>(query_group[0].size());
  std::vector<std::vector<int32_t>> out(rows);
  for (size_t h = 0; h < query_group.size(); ++h) {
    std::vector<std::vector<int32_t>> members(keys + 1);
    for (int64_t j = 0; j < keys; ++j) members[key_group[h][j]].push_back(static_cast<int32_t>(j));
    for (int64_t i = 0; i < rows; ++i) {
      const auto& group = members[query_group[h][i]];
      out[i].insert(out[i].end(), group.begin(), group.end());
    }
  }
  return support_from_rows(std::move(out));
}

std::vector<int64_t> index_range(int64_t begin, int64_t end) {
  std::vector<int64_t> out(std::max<int64_t>(0, end - begin));
  std::iota(out.begin(), out.end(), begin);
  return out;
}

}  // namespace attnprobe
