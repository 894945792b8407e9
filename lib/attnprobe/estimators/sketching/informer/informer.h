#pragma once
// informer(d) — Informer's ProbSparse row selection as adapted in the Skeinformer code (Zhou et al.,
// AAAI 2021; docs/estimators/sketching.md). Target: softmax.
//   c = ⌈d / ln n⌉, u = U = min(c·⌈ln n⌉, n). For each query, U key indices uniformly with
//   replacement; sparsity M_i = max_sampled(s·q_i·k_j) − (1/n)·Σ_sampled(s·q_i·k_j) (divisor n,
//   as in Informer's code). The u queries with the largest M_i get their exact softmax row; every
//   other row gets mean(V). With u = n it is exact. Cost O(n·U·p + u·n·p).
// The parameters and the query selection are shared by the CPU version and the CUDA one, so both
// pick the same rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attnprobe/common/parallel.h"
#include "attnprobe/common/rounding.h"
#include "attnprobe/rng/random_stream.h"
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
};

/// The u "active" query rows (u = ⌈d/ln n⌉·⌈ln n⌉, at most n), most active first: U sampled keys
/// per query (Purpose::kRowSample), sparsity max − sum/n of the sampled float32 logits, ties by
/// index. Cost O(n·u·p); query blocks run on the pool when one is given (the rows chosen do not
/// depend on it). `stored` below float32: each sampled logit and each sparsity stored in the precision, as the
/// reference computes them in the model's dtype, so sparsities that round alike tie (the earlier row wins).
std::vector<int64_t> informer_active_rows(const HeadView& view, const RandomKey& key, const InformerParams& params,
                                          ThreadPool* pool = nullptr, Precision stored = Precision::kF32);

}  // namespace attnprobe
