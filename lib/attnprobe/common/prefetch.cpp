#include "attnprobe/common/prefetch.h"

namespace attnprobe {

void NextBlock::share(int64_t step, int64_t steps) const {
  for (int r = 0; r < count_; ++r) {
    const int64_t lines = (ranges_[r].bytes + kLine - 1) / kLine;
    const int64_t begin = lines * step / steps, end = lines * (step + 1) / steps;
    for (int64_t line = begin; line < end; ++line) __builtin_prefetch(ranges_[r].begin + line * kLine);
  }
}

}  // namespace attnprobe
