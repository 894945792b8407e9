#pragma once
// Per-row work of a kept-keys method done for several rows at once (quest's page bounds, sparq's approximate
// logits): what it reads for one row (2 MiB of page bounds, or every key's chosen channels, at 65536 keys) is read
// once for all the rows of a block while it is in cache, instead of once per row from memory.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {

/// Row i's PerRow, computed for its whole block of kKeptRowsPerTask rows on the first request of any of them.
/// Blocks are attend_kept's tasks, so the rows of one block are asked for by one thread in turn and no two threads
/// wait on one block; a row's PerRow is handed over once, and asked for again (a caller reading a row twice) it is
/// computed for that row alone. `compute(first, end)` returns rows [first, end)'s, each exactly what
/// compute(i, i + 1) returns for it: a row's result never depends on the rows it was computed with.
template <class PerRow>
class RowBlocks {
 public:
  using Compute = std::function<std::vector<PerRow>(int64_t first, int64_t end)>;

  RowBlocks(int64_t rows, Compute compute)
      : rows_(rows), compute_(std::move(compute)), blocks_((rows + kKeptRowsPerTask - 1) / kKeptRowsPerTask) {}

  PerRow take(int64_t i) {
    Block& block = blocks_[i / kKeptRowsPerTask];
    std::lock_guard<std::mutex> lock(block.mutex);
    if (block.rows.empty()) {
      const int64_t first = i / kKeptRowsPerTask * kKeptRowsPerTask;
      block.rows = compute_(first, std::min(rows_, first + kKeptRowsPerTask));
      block.taken.assign(block.rows.size(), false);
    }
    const int64_t in_block = i % kKeptRowsPerTask;
    if (block.taken[in_block]) return compute_(i, i + 1).front();
    block.taken[in_block] = true;
    return std::move(block.rows[in_block]);
  }

 private:
  struct Block {
    std::mutex mutex;
    std::vector<PerRow> rows;  ///< empty until computed
    std::vector<bool> taken;
  };

  int64_t rows_;
  Compute compute_;
  std::vector<Block> blocks_;
};

}  // namespace attnprobe
