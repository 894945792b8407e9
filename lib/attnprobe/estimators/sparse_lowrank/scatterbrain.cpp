// scatterbrain(M, sparse, w, ext, rounds, features, ortho) — Scatterbrain (Chen, Dao, Winsor, Song,
// Rudra, Ré, NeurIPS 2021; reference HazyResearch/fly SBLocal/SBSmyrf, re-implemented in
// HKUNLP/efficient-attention). Target: softmax. Exact on a sparse support S_i, random features off it:
//   N̂_i = Σ_{j∈S_i} e_ij·v_j + Σ_{j∉S_i} ê_ij·v_j,  D̂_i = Σ_{j∈S_i} e_ij + Σ_{j∉S_i} ê_ij,  out_i = N̂_i / D̂_i,
// e_ij = exp(s·q_i·k_j), ê_ij = φ(q_i)·φ(k_j). The complement is evaluated as global minus support,
// φ(q_i)·(Σ_j φ(k_j)v_jᵀ) − Σ_{j∈S_i} ê_ij·v_j (fly's form), with one shift per row shared by both parts:
// a_i = max(c_i + c_K, max_{j∈S_i} s·q_i·k_j), c_i the row max of log φ(q_i), c_K the max of log φ(k).
// Supports: local (fly SBLocal's window j ∈ [i − ⌊w/2⌋, i + ⌈w/2⌉ − 1]), block (query blocks of w, keys
// extended by ext each side), sortlsh (the sortLSH blocks with b = w, r = 7, Gray order), smyrf (per round
// an XBOX+ lift, one Gaussian projection, sort, clusters of w; the union over rounds). Features: hyp (fly:
// ⌊M/2⌋ ω with ξ(x, ±ω)), pos (`performer`'s), oprf (`favorpp`'s A*). For a fixed support E[N̂_i] = N_i and
// E[D̂_i] = D_i; every entry of the implied matrix is exact on S and Performer's off it; the ratio is
// biased. Only the denominator complement is clamped at 0 (it is ≥ 0 up to rounding for positive
// features); no epsilon. Reference differences: efficient-attention's complement uses log(e^a − e^b +
// 1e-5) and a 1e-3 clamp (biased when the complement is small); fly's LRA configs set softmax_eps 1e-4;
// smyrf pads to a multiple of w (here the last cluster is shorter); fly's E2LSH bucket width and shift
// do not change the sort (not drawn here). No causal form in this version.
// Precision: features and exact logits in S; the global sums, the support's feature sums and their
// difference in float64, because the difference cancels when S holds most of φ's mass.
// Cost O(n·M·(p + pv) + n·|S|·(p + M + pv)) plus O(n·p·rounds + n log n) for hashed supports.
#include "attnprobe/estimators/sparse_lowrank/scatterbrain.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sorted_lsh/sort_lsh.h"

namespace attnprobe {

ScatterbrainParams ScatterbrainParams::from_spec(const Spec& spec) {
  ScatterbrainParams params;
  params.features = spec.get_int("M");
  const std::string& sparse = spec.get_choice("sparse");
  params.sparse = sparse == "local"     ? SbSupport::kLocal
                  : sparse == "block"   ? SbSupport::kBlock
                  : sparse == "sortlsh" ? SbSupport::kSortLsh
                                        : SbSupport::kSmyrf;
  params.width = spec.get_int("w");
  params.ext = spec.get_int("ext");
  params.rounds = static_cast<int>(spec.get_int("rounds"));
  const std::string& kind = spec.get_choice("features");
  params.kind = kind == "hyp" ? SbFeatures::kHyp : kind == "pos" ? SbFeatures::kPos : SbFeatures::kOprf;
  params.orthogonal = spec.get_int("ortho") == 1;
  if (params.sparse == SbSupport::kBlock && params.width == 0)
    throw InputError("scatterbrain: sparse=block needs w >= 1 (the query block size)");
  return params;
}

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

SparseSupport scatterbrain_support(const ScatterbrainParams& params, const HeadView& view, RandomKey key) {
  const int64_t n = view.n(), w = params.width;
  std::vector<std::vector<int32_t>> rows(n);
  auto add_range = [&](int64_t i, int64_t begin, int64_t end) {
    for (int64_t j = std::max<int64_t>(0, begin); j < std::min(end, n); ++j) rows[i].push_back(static_cast<int32_t>(j));
  };
  // Keys grouped by their block/cluster index, to fill H_i-style supports in O(n·|S|).
  auto add_by_group = [&](const std::vector<int64_t>& query_group, const std::vector<int64_t>& key_group) {
    std::vector<std::vector<int32_t>> members(n + 1);
    for (int64_t j = 0; j < n; ++j) members[key_group[j]].push_back(static_cast<int32_t>(j));
    for (int64_t i = 0; i < n; ++i)
      rows[i].insert(rows[i].end(), members[query_group[i]].begin(), members[query_group[i]].end());
  };
  if (w > 0) {
    switch (params.sparse) {
      case SbSupport::kLocal:
        for (int64_t i = 0; i < n; ++i) add_range(i, i - w / 2, i + (w + 1) / 2);
        break;
      case SbSupport::kBlock:
        for (int64_t i = 0; i < n; ++i) add_range(i, (i / w) * w - params.ext, (i / w + 1) * w + params.ext);
        break;
      case SbSupport::kSortLsh: {
        const SortLshBlocks blocks = sort_lsh_blocks(view.q, view.k, 7, w, BucketOrder::kGray, key);
        add_by_group(blocks.query_block, blocks.key_block);
        break;
      }
      case SbSupport::kSmyrf: {
        // XBOX+: q → [q, 0, √(Mq² + Mk² − ‖q‖²)], k → [k, √(Mq² + Mk² − ‖k‖²), 0] keeps q·k and makes
        // every lifted vector's norm equal; float64 so that the sort is the same on any device.
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
          add_by_group(clusters_by_projection(q_proj, w), clusters_by_projection(k_proj, w));
        }
        break;
      }
    }
  }
  SparseSupport support;
  support.offsets.assign(1, 0);
  for (auto& row : rows) {
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());  // a pair found in several rounds counts once
    support.keys.insert(support.keys.end(), row.begin(), row.end());
    support.offsets.push_back(static_cast<int64_t>(support.keys.size()));
  }
  return support;
}

GerfMap scatterbrain_features(const ScatterbrainParams& params, const HeadView& view, RandomKey key) {
  const int64_t p = view.p();
  switch (params.kind) {
    case SbFeatures::kHyp:
      return hyperbolic_map(draw_omegas(params.features / 2, p, params.orthogonal, key));
    case SbFeatures::kPos:
      return positive_map(draw_omegas(params.features, p, params.orthogonal, key));
    case SbFeatures::kOprf: {
      const double root = std::sqrt(view.scale);
      return fit_gerf(GerfOptions{}, root * view.q, root * view.k, params.features, params.orthogonal, key);
    }
  }
  return {};
}

template <typename S>
MatrixT<S> scatterbrain_attention(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                  VectorD* log_denominator) {
  const int64_t n = view.n(), pv = view.pv();
  const SliceData<S> data = slice_data<S>(view);
  const S root = static_cast<S>(std::sqrt(view.scale)), s = static_cast<S>(view.scale);
  const SparseSupport support = scatterbrain_support(params, view, key);
  const GerfMap map = scatterbrain_features(params, view, key);

  MatrixT<S> query_features = gerf_log_features<S>(map, MatrixT<S>(root * data.q), true);  // n × M
  MatrixT<S> key_features = gerf_log_features<S>(map, MatrixT<S>(root * data.k), false);   // n × M
  const S key_shift = key_features.maxCoeff();
  key_features = (key_features.array() - key_shift).exp();
  VectorD query_shift(n);
  for (int64_t i = 0; i < n; ++i) {
    query_shift(i) = static_cast<double>(key_shift) + query_features.row(i).maxCoeff();
    query_features.row(i).array() = (query_features.row(i).array() - query_features.row(i).maxCoeff()).exp();
  }
  const MatrixD key_features_d = key_features.template cast<double>();
  const MatrixD kv = key_features_d.transpose() * data.v.template cast<double>();  // M × pv
  const VectorD key_sum = key_features_d.colwise().sum().transpose();              // M
  const MatrixD global_num = query_features.template cast<double>() * kv;          // n × pv
  const VectorD global_den = query_features.template cast<double>() * key_sum;     // n

  MatrixT<S> out(n, pv);
  if (log_denominator) log_denominator->resize(n);
  std::vector<S> logits;
  RowVectorD num(pv), feature_num(pv);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t begin = support.offsets[i], count = support.offsets[i + 1] - begin;
    logits.resize(count);
    double shift = query_shift(i);  // a_i: one shift for the exact and the feature parts
    for (int64_t t = 0; t < count; ++t) {
      logits[t] = s * data.q.row(i).dot(data.k.row(support.keys[begin + t]));
      shift = std::max(shift, static_cast<double>(logits[t]));
    }
    const double feature_scale = std::exp(query_shift(i) - shift);
    num.setZero();
    feature_num.setZero();
    double den = 0, feature_den = 0;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t j = support.keys[begin + t];
      const double e = std::exp(static_cast<double>(logits[t]) - shift);
      const double e_hat = static_cast<double>(query_features.row(i).dot(key_features.row(j)));
      num += e * data.v.row(j).template cast<double>();
      den += e;
      feature_num += e_hat * data.v.row(j).template cast<double>();
      feature_den += e_hat;
    }
    num += feature_scale * (global_num.row(i) - feature_num);
    den += feature_scale * std::max(0.0, global_den(i) - feature_den);
    out.row(i) = (num / den).template cast<S>();
    if (log_denominator) (*log_denominator)(i) = shift + std::log(den);
  }
  return out;
}

template MatrixT<float> scatterbrain_attention<float>(const ScatterbrainParams&, const HeadView&, RandomKey, VectorD*);
template MatrixT<double> scatterbrain_attention<double>(const ScatterbrainParams&, const HeadView&, RandomKey,
                                                        VectorD*);

namespace {

class Scatterbrain final : public Estimator {
 public:
  explicit Scatterbrain(ScatterbrainParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    out = scatterbrain_attention<float>(params_, view, ctx.key);
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double support = static_cast<double>(std::min<int64_t>(params_.width + 2 * params_.ext, n)) *
                           (params_.sparse == SbSupport::kSmyrf ? params_.rounds : 1);
    return 2.0 * 2.0 * n * params_.features * (p + pv) + 2.0 * n * support * (p + params_.features + 2 * pv);
  }

 private:
  ScatterbrainParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "scatterbrain",
    .family = "sparse-lowrank",
    .summary = "Scatterbrain: exact softmax on a sparse support (local/block/sortlsh/smyrf) + random features off "
               "it (O(n (M + w) p))",
    .params = {{"M", ParamKind::kInt, "64", 2, 1 << 20, {}, "random features (hyp: M/2 pairs of +-omega)"},
               {"sparse",
                ParamKind::kChoice,
                "local",
                0,
                0,
                {"local", "block", "sortlsh", "smyrf"},
                "support: local window, query blocks, sortLSH blocks, SMYRF clusters"},
               {"w", ParamKind::kInt, "32", 0, 1 << 24, {}, "window / block / cluster size (0: empty support)"},
               {"ext", ParamKind::kInt, "0", 0, 1 << 24, {}, "block: keys extended by ext on each side"},
               {"rounds", ParamKind::kInt, "2", 1, 64, {}, "smyrf: hashing rounds (union of clusters)"},
               {"features",
                ParamKind::kChoice,
                "hyp",
                0,
                0,
                {"hyp", "pos", "oprf"},
                "features: hyp (fly, +-omega), pos (performer), oprf (favorpp's A*)"},
               {"ortho", ParamKind::kInt, "1", 0, 1, {}, "1: orthogonal blocks of features; 0: iid"}},
    .samples_knob = "M",
    .random = true,
    .target = nullptr,
    .make = [](const Spec& spec) { return std::make_unique<Scatterbrain>(ScatterbrainParams::from_spec(spec)); },
});

}  // namespace
}  // namespace attnprobe
