#pragma once
// Software prefetch of the rows a pass over row blocks reads next, spread over the current block's work.
//
// Why: once Q, K, V and the output outgrow the last-level cache (n ≳ 32768 at p = 64 on the 32 MiB Zen 5
// VMs), a block pass reads its next block from memory. The hardware prefetchers stop at every 4 KiB
// page and start again only after a few misses, and a block of 256 rows of 64 floats spans 16 pages: the
// block's first reads of each page then wait for memory, one after another. Asking for the next block a
// little at a time while the current block computes (a row's worth of lines per row of work) hides that
// wait. All at once, at the start of a block, it did nothing: a thousand lines overflow the core's queue
// of outstanding misses and most requests are dropped. share() is compiled out of line on purpose:
// inlined into the loops it serves, GCC's code for them lost the whole gain (LARA at n = 65536: 24.5 ms
// inlined, 20.1 ms as a call, 24.6 ms with no prefetch). One Zen 5 core, three alternating rounds:
//   LARA's query passes:                      n = 65536 25.9 → 20.9 ms; 16384 (in the cache) 5.46 → 5.12 ms
//   the exact kernel's query blocks (Nyström's output pass) and key chunks: nystrom at 65536 16.1 → 14.7 ms
//   Performer's key and query passes (feature_attention.cpp): performer 15.3 → 13.4, favorpp 16.2 → 14.6 ms
// Users: lara.cpp, exact_attention.cpp, feature_attention.cpp.
#include <array>
#include <cstdint>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

/// Up to three contiguous byte ranges (the next block's rows of Q, of a buffer, ...) to be prefetched in
/// `steps` equal shares, share(step) asking for the step-th. Ranges that are empty or null are skipped, so
/// the last block of a pass passes none.
class NextBlock {
 public:
  /// `pass_bytes`: what the whole pass reads and writes. Below kFromBytes the pass's rows stay in the core's
  /// own caches, the prefetches would be pure cost (LARA at n = 1024: 0.314 → 0.321 ms), and no range is kept.
  explicit NextBlock(int64_t pass_bytes) : wanted_(pass_bytes >= kFromBytes) {}

  /// Adds rows [first, first + rows) of a row-major float matrix with leading dimension ld (nothing when
  /// first is null or rows ≤ 0).
  NextBlock& rows(const float* first, int64_t rows, int64_t ld) {
    if (wanted_ && first != nullptr && rows > 0 && count_ < kRanges)
      ranges_[count_++] = {reinterpret_cast<const char*>(first), rows * ld * static_cast<int64_t>(sizeof(float))};
    return *this;
  }

  /// Prefetches share `step` of `steps` (0 ≤ step < steps) of every range, into the first-level cache.
  void share(int64_t step, int64_t steps) const;

 private:
  static constexpr int64_t kFromBytes = int64_t{4} << 20;  // four times a Zen 5 core's L2
  static constexpr int kRanges = 3;
  static constexpr int64_t kLine = 64;
  struct Range {
    const char* begin = nullptr;
    int64_t bytes = 0;
  };
  std::array<Range, kRanges> ranges_{};
  int count_ = 0;
  bool wanted_;
};

/// The NextBlock of a pass over the rows of a and b together (Q and the output, K and V): rows
/// [first, first + count) of both, nothing when count ≤ 0, none at all when the two fit the core's caches.
inline NextBlock next_rows(const MatrixF& a, const MatrixF& b, int64_t first, int64_t count) {
  NextBlock ahead(a.rows() * (a.cols() + b.cols()) * static_cast<int64_t>(sizeof(float)));
  if (count > 0) ahead.rows(a.row(first).data(), count, a.cols()).rows(b.row(first).data(), count, b.cols());
  return ahead;
}

}  // namespace attnprobe
