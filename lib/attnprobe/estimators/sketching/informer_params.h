#pragma once
// The decoded parameters of informer and its query selection, shared by the CPU version
// (informer.cpp) and the CUDA one (gpu/informer.cu), so both pick the same rows.
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

struct InformerParams {
  int64_t d = 64;  ///< budget: u = ⌈d / ln n⌉·⌈ln n⌉ exact rows (at most n)

  static InformerParams from_spec(const Spec& spec) { return {spec.get_int("d")}; }
};

/// The u "active" query rows (u = ⌈d/ln n⌉·⌈ln n⌉, at most n), most active first: U sampled keys
/// per query (Purpose::kRowSample), sparsity max − sum/n of the sampled float32 logits, ties by
/// index. Cost O(n·u·p); query blocks run on the pool when one is given (the rows chosen do not
/// depend on it).
std::vector<int64_t> informer_active_rows(const HeadView& view, const RandomKey& key, const InformerParams& params,
                                          ThreadPool* pool = nullptr);

}  // namespace attnprobe
