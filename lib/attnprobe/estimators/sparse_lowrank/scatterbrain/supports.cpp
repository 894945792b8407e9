// scatterbrain's supports S_i (scatterbrain.h): local windows and query blocks by position
// (common/sparse_support.h), sortLSH blocks and SMYRF clusters from hashing, and its feature maps.
#include <algorithm>
#include <numeric>

#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/sorted_lsh/sort_lsh.h"
#include "attnprobe/estimators/sparse_lowrank/scatterbrain/scatterbrain.h"

namespace attnprobe {

namespace {

// Cluster index of every row when rows are sorted by (value, index) and cut into clusters of w.
std::vector<int64_t> clusters_by_projection(const VectorD& values, int64_t width) {
  const int64_t n = values.size();
  std::vector<int64_t> order(n), cluster(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return values(a) < values(b); });
  for (int64_t pos = 0; pos < n; ++pos) cluster[order[pos]] = pos / width;
  return cluster;
}

}  // namespace

ScatterbrainGroupings scatterbrain_groupings(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                             ThreadPool* pool) {
  ScatterbrainGroupings out;
  const int64_t w = params.width;
  if (params.sparse == SbSupport::kSortLsh) {
    const SortLshBlocks blocks = sort_lsh_blocks(view.q, view.k, 7, w, BucketOrder::kGray, key, pool);
    out.query_group.push_back(blocks.query_block);
    out.key_group.push_back(blocks.key_block);
    return out;
  }
  // XBOX+: q → [q, 0, √(Mq² + Mk² − ‖q‖²)], k → [k, √(Mq² + Mk² − ‖k‖²), 0] keeps q·k and makes every lifted
  // vector's norm equal; float64 so that the sort is the same on any device.
  const int64_t p = view.p();
  const VectorD q_sq = view.q.rowwise().squaredNorm(), k_sq = view.k.rowwise().squaredNorm();
  const double total = q_sq.maxCoeff() + k_sq.maxCoeff();
  const VectorD q_lift = (total - q_sq.array()).max(0.0).sqrt(), k_lift = (total - k_sq.array()).max(0.0).sqrt();
  const RandomStream stream(key, Purpose::kHashProjection);
  VectorD alpha(p + 2);
  for (int h = 0; h < params.rounds; ++h) {
    stream.normals(static_cast<uint32_t>(h), 0, alpha.data(), p + 2);
    const VectorD q_proj = view.q * alpha.head(p) + alpha(p + 1) * q_lift;
    const VectorD k_proj = view.k * alpha.head(p) + alpha(p) * k_lift;
    out.query_group.push_back(clusters_by_projection(q_proj, w));
    out.key_group.push_back(clusters_by_projection(k_proj, w));
  }
  return out;
}

SparseSupport scatterbrain_support(const ScatterbrainParams& params, const HeadView& view, RandomKey key) {
  const int64_t n = view.n(), w = params.width;
  if (w == 0) return empty_support(n);
  switch (params.sparse) {
    case SbSupport::kLocal:
      return window_support(n, n, w / 2, (w + 1) / 2 - 1);
    case SbSupport::kBlock:
      return block_support(n, n, w, params.ext);
    case SbSupport::kSortLsh:
    case SbSupport::kSmyrf:
      break;
  }
  const ScatterbrainGroupings groupings = scatterbrain_groupings(params, view, key);
  return group_support(groupings.query_group, groupings.key_group, n);
}

GerfMap scatterbrain_features(const ScatterbrainParams& params, const HeadView& view, RandomKey key) {
  const int64_t p = view.p();
  switch (params.kind) {
    case SbFeatures::kHyp:
      return hyperbolic_map(draw_omegas(params.features / 2, p, params.orthogonal, key));
    case SbFeatures::kPos:
      return positive_map(draw_omegas(params.features, p, params.orthogonal, key));
    case SbFeatures::kOprf: {
      return fit_gerf(GerfOptions{}, view.q, view.k, view.scale, params.features, params.orthogonal, key);
    }
  }
  return {};
}

}  // namespace attnprobe
