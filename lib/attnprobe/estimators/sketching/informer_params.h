#pragma once
// The decoded parameters of informer and its query selection, shared by the CPU version
// (informer.cpp) and the CUDA one (gpu/informer.cu), so both pick the same rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

struct InformerParams {
  int64_t d = 64;  ///< budget: u = ⌈d / ln n⌉·⌈ln n⌉ exact rows (at most n)

  /// u = U = min(⌈d / ln n⌉·⌈ln n⌉, n): the sampled keys per query and the exact rows, at length n.
  int64_t budget(int64_t n) const {
    const double log_n = std::log(static_cast<double>(std::max<int64_t>(n, 2)));
    const int64_t c = static_cast<int64_t>(std::ceil(static_cast<double>(d) / log_n));
    return std::min<int64_t>(c * static_cast<int64_t>(std::ceil(log_n)), n);
  }

  static InformerParams from_spec(const Spec& spec) { return {spec.get_int("d")}; }
};

/// The u "active" query rows (u = ⌈d/ln n⌉·⌈ln n⌉, at most n), most active first: U sampled keys
/// per query (Purpose::kRowSample), sparsity max − sum/n of the sampled float32 logits, ties by
/// index. Cost O(n·u·p); query blocks run on the pool when one is given (the rows chosen do not
/// depend on it).
std::vector<int64_t> informer_active_rows(const HeadView& view, const RandomKey& key, const InformerParams& params,
                                          ThreadPool* pool = nullptr);

}  // namespace attnprobe
