#pragma once
// Per-row key sets in compressed rows: the supports of scatterbrain's exact part, and the structural
// output of every estimator that reads a subset of the keys per query (which keys a row attends to must
// be identical on every device, so it is kept as exact indices, never as weights).
#include <cstdint>
#include <span>
#include <vector>

namespace attnprobe {

/// Row i's keys are keys[offsets[i] .. offsets[i+1]), ascending and distinct.
struct SparseSupport {
  std::vector<int64_t> offsets;  ///< rows + 1
  std::vector<int32_t> keys;

  int64_t rows() const { return static_cast<int64_t>(offsets.size()) - 1; }
  std::span<const int32_t> row(int64_t i) const {
    return {keys.data() + offsets[i], static_cast<size_t>(offsets[i + 1] - offsets[i])};
  }
};

/// Sorts each row and drops repeats (a key reached twice counts once), then packs the rows.
SparseSupport support_from_rows(std::vector<std::vector<int32_t>> rows);
/// `rows` rows with no keys.
SparseSupport empty_support(int64_t rows);
/// Row i: keys [i − before, i + after] ∩ [0, keys) (a window around the row's own position).
SparseSupport window_support(int64_t rows, int64_t keys, int64_t before, int64_t after);
/// Row i: the keys of its block of `width` rows, [⌊i/width⌋·width − ext, (⌊i/width⌋ + 1)·width + ext) ∩ [0, keys).
SparseSupport block_support(int64_t rows, int64_t keys, int64_t width, int64_t ext);
/// Row i: every key j with key_group[h][j] == query_group[h][i] for some round h (the union over rounds).
/// Group ids are in [0, keys].
SparseSupport group_support(const std::vector<std::vector<int64_t>>& query_group,
                            const std::vector<std::vector<int64_t>>& key_group, int64_t keys);

/// begin, begin + 1, …, end − 1 (empty when end ≤ begin).
std::vector<int64_t> index_range(int64_t begin, int64_t end);

}  // namespace attnprobe
