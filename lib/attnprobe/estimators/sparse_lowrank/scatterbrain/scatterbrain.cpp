#include "attnprobe/estimators/sparse_lowrank/scatterbrain/scatterbrain.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/common/sparse_support.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {

namespace {

// Per-row sums of one query chunk, all scaled by exp(−shift_i): the exact support part (num, den) and
// the features on the support (feature_num, feature_den), float64.
struct RowSums {
  VectorD shift, den, feature_den;
  MatrixD num, feature_num;
  void reset(int64_t rows, int64_t pv) {
    shift.resize(rows);
    den.setZero(rows);
    feature_den.setZero(rows);
    num.setZero(rows, pv);
    feature_num.setZero(rows, pv);
  }
};

template <typename S>
class ScatterbrainRun {
 public:
  ScatterbrainRun(const ScatterbrainParams& params, const HeadView& view, RandomKey key, ThreadPool* pool,
                  Precision stored)
      : view_(view), data_(slice_data<S>(view)), n_(view.n()), pv_(view.pv()), stored_(stored) {
    const GerfMap map = scatterbrain_features(params, view, key);
    const int64_t m = map.projections.rows();
    // The n × M log-features in fixed row blocks on the pool (the bits do not depend on the thread count).
    query_features_.resize(n_, m);
    key_features_.resize(n_, m);
    const int64_t feature_blocks = (n_ + kFeatureRows - 1) / kFeatureRows;
    for_each_index(pool, feature_blocks, [&](int64_t b) {
      const int64_t r0 = b * kFeatureRows, rows = std::min(kFeatureRows, n_ - r0);
      query_features_.middleRows(r0, rows) =
          gerf_log_features<S>(map, MatrixT<S>(data_.q.middleRows(r0, rows)), view.scale, true);
      key_features_.middleRows(r0, rows) =
          gerf_log_features<S>(map, MatrixT<S>(data_.k.middleRows(r0, rows)), view.scale, false);
    });
    // φ(q_i)·φ(k_j) = e^{c_i}·φ̃·φ̃
    exponentiate_features<S>(query_features_, key_features_, &query_shift_, pool);
    store(query_features_);
    store(key_features_);
    // Σ_j φ̃(k_j)v_jᵀ (columns 0..pv−1) and Σ_j φ̃(k_j) (column pv) in float64: 64-row chunks (no n × M
    // float64 temporary) within sum_row_groups' fixed groups of keys on the pool.
    const MatrixD sums =
        sum_row_groups<MatrixD>(pool, n_, MatrixD::Zero(m, pv_ + 1), [&](int64_t begin, int64_t end, MatrixD& part) {
          for (int64_t r0 = begin; r0 < end; r0 += kChunk) {
            const int64_t rows = std::min(kChunk, end - r0);
            const MatrixD chunk = key_features_.middleRows(r0, rows).template cast<double>();
            part.leftCols(pv_).noalias() += chunk.transpose() * data_.v.middleRows(r0, rows).template cast<double>();
            part.col(pv_) += column_sums(chunk).transpose();
          }
        });
    kv_ = sums.leftCols(pv_);
    key_sum_ = sums.col(pv_);
    store_below_float32(kv_, stored_);
    store_below_float32(key_sum_, stored_);
  }

  /// Adds the pairs (queries[r], keys[u]) with allowed(r, u) to sums (rows = queries.size() ≤ kChunk):
  /// exact logits and feature products by two small matrix products, one shift per row kept online.
  template <typename Allowed>
  void add_group(const std::vector<int64_t>& queries, const std::vector<int64_t>& keys, Allowed allowed,
                 RowSums& sums) const {
    const int64_t rows = static_cast<int64_t>(queries.size()), cols = static_cast<int64_t>(keys.size());
    if (cols == 0) return;
    // Gathered into contiguous matrices first: a product over an indexed view runs element by element
    // (it made the one-query groups of later SMYRF rounds ~10x slower).
    const MatrixT<S> q = data_.q(queries, Eigen::all), k = data_.k(keys, Eigen::all), v = data_.v(keys, Eigen::all);
    const MatrixT<S> q_features = query_features_(queries, Eigen::all), k_features = key_features_(keys, Eigen::all);
    MatrixT<S> logits = static_cast<S>(view_.scale) * (q * k.transpose());  // rows × cols
    MatrixT<S> e_hat = q_features * k_features.transpose();                 // rows × cols
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t u = 0; u < cols; ++u)
        if (!allowed(r, u)) logits(r, u) = -std::numeric_limits<S>::infinity(), e_hat(r, u) = 0;
      const double top = std::max(sums.shift(r), static_cast<double>(logits.row(r).maxCoeff()));
      if (top > sums.shift(r)) {  // a larger exact logit: rescale what this row has so far
        const double factor = std::exp(sums.shift(r) - top);
        sums.num.row(r) *= factor, sums.feature_num.row(r) *= factor;
        sums.den(r) *= factor, sums.feature_den(r) *= factor;
        sums.shift(r) = top;
      }
      logits.row(r).array() = (logits.row(r).array() - static_cast<S>(sums.shift(r))).exp();
      e_hat.row(r) *= static_cast<S>(std::exp(query_shift_(queries[r]) - sums.shift(r)));
    }
    sums.den += logits.rowwise().sum().template cast<double>();
    sums.feature_den += e_hat.rowwise().sum().template cast<double>();
    store(logits);  // after their row sums, before their products with V: P in FlashAttention-2
    store(e_hat);
    sums.num += (logits * v).template cast<double>();
    sums.feature_num += (e_hat * v).template cast<double>();
  }

  /// Starts sums for a chunk of queries: shift a_i = c_i until an exact logit exceeds it.
  void start(const std::vector<int64_t>& queries, RowSums& sums) const {
    sums.reset(static_cast<int64_t>(queries.size()), pv_);
    for (size_t r = 0; r < queries.size(); ++r) sums.shift(r) = query_shift_(queries[r]);
  }

  /// out_i = (Σ_S e v + global − Σ_S ê v) / (Σ_S e + max(0, global − Σ_S ê)) for the chunk's queries.
  void finish(const std::vector<int64_t>& queries, const RowSums& sums, MatrixT<S>& out,
              VectorD* log_denominator) const {
    const MatrixD features = query_features_(queries, Eigen::all).template cast<double>();
    const MatrixD global_num = features * kv_;
    const VectorD global_den = features * key_sum_;
    for (size_t r = 0; r < queries.size(); ++r) {
      const double scale = std::exp(query_shift_(queries[r]) - sums.shift(r));
      const RowVectorD num = sums.num.row(r) + scale * global_num.row(r) - sums.feature_num.row(r);
      const double den = sums.den(r) + std::max(0.0, scale * global_den(r) - sums.feature_den(r));
      out.row(queries[r]) = (num / den).template cast<S>();
      if (log_denominator) (*log_denominator)(queries[r]) = sums.shift(r) + std::log(den);
    }
  }

  static constexpr int64_t kChunk = 64;
  static constexpr int64_t kFeatureRows = 256;  ///< rows of log-features formed at once

 private:
  // A tensor a GPU kernel stores between its steps, rounded to the case's precision (float64 runs: as it is).
  void store(MatrixT<S>& tensor) const {
    if constexpr (std::is_same_v<S, float>) round_in_place(tensor, stored_);
  }

  const HeadView& view_;
  SliceData<S> data_;
  int64_t n_, pv_;
  MatrixT<S> query_features_, key_features_;  // φ̃ = exp(log φ − shift), n × M
  VectorD query_shift_;                       // c_i
  MatrixD kv_;                                // M × pv
  VectorD key_sum_;                           // M
  Precision stored_;
};

}  // namespace

template <typename S>
MatrixT<S> scatterbrain_attention(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                  VectorD* log_denominator, ThreadPool* pool, Precision stored) {
  using Run = ScatterbrainRun<S>;
  const int64_t n = view.n(), w = params.width, chunk = Run::kChunk;
  const Run run(params, view, key, pool, stored);
  MatrixT<S> out(n, view.pv());
  if (log_denominator) log_denominator->resize(n);
  RowSums sums;
  auto always = [](int64_t, int64_t) { return true; };
  // Chunks of queries, each finished on its own (it writes only its rows), on the pool.
  auto for_each_chunk = [&](int64_t count, const auto& add_pairs) {
    for_each_index(pool, count, [&](int64_t c) {
      thread_local RowSums chunk_sums;
      const std::vector<int64_t> queries = add_pairs(c, chunk_sums);
      run.finish(queries, chunk_sums, out, log_denominator);
    });
  };
  if (w == 0) {  // empty support: Performer
    for_each_chunk((n + chunk - 1) / chunk, [&](int64_t c, RowSums& chunk_sums) {
      const std::vector<int64_t> queries = index_range(c * chunk, std::min(n, (c + 1) * chunk));
      run.start(queries, chunk_sums);
      return queries;
    });
    return out;
  }
  switch (params.sparse) {
    case SbSupport::kLocal:
    case SbSupport::kBlock: {
      // Chunks of consecutive queries (within one block for `block`) against the union of their windows.
      const int64_t step = params.sparse == SbSupport::kBlock ? std::min(chunk, w) : chunk;
      std::vector<int64_t> starts;  // chunk c: queries [starts[c], starts[c + 1])
      for (int64_t r0 = 0; r0 < n;) {
        starts.push_back(r0);
        r0 = params.sparse == SbSupport::kBlock ? std::min({n, r0 + step, (r0 / w + 1) * w}) : std::min(n, r0 + step);
      }
      starts.push_back(n);
      for_each_chunk(static_cast<int64_t>(starts.size()) - 1, [&](int64_t c, RowSums& chunk_sums) {
        const int64_t r0 = starts[c], r1 = starts[c + 1];
        int64_t k0, k1;
        if (params.sparse == SbSupport::kLocal)
          k0 = r0 - w / 2, k1 = r1 - 1 + (w + 1) / 2;
        else
          k0 = (r0 / w) * w - params.ext, k1 = (r0 / w + 1) * w + params.ext;
        k0 = std::max<int64_t>(0, k0), k1 = std::min(n, k1);
        const std::vector<int64_t> queries = index_range(r0, r1), keys = index_range(k0, k1);
        run.start(queries, chunk_sums);
        if (params.sparse == SbSupport::kLocal)
          run.add_group(
              queries, keys,
              [&](int64_t r, int64_t u) {
                const int64_t i = r0 + r, j = k0 + u;
                return j >= i - w / 2 && j < i + (w + 1) / 2;
              },
              chunk_sums);
        else
          run.add_group(queries, keys, always, chunk_sums);
        return queries;
      });
      break;
    }
    case SbSupport::kSortLsh:
    case SbSupport::kSmyrf: {
      // Each round's groups share their keys; a pair met in an earlier round is not counted again.
      const ScatterbrainGroupings groupings = scatterbrain_groupings(params, view, key, pool);
      const int64_t rounds = static_cast<int64_t>(groupings.query_group.size());
      const int64_t groups = (n + w - 1) / w;
      std::vector<std::vector<std::vector<int64_t>>> query_members(rounds), key_members(rounds);
      for (int64_t h = 0; h < rounds; ++h) {
        query_members[h].resize(groups);
        key_members[h].resize(groups);
        for (int64_t i = 0; i < n; ++i) query_members[h][groupings.query_group[h][i]].push_back(i);
        for (int64_t j = 0; j < n; ++j) key_members[h][groupings.key_group[h][j]].push_back(j);
      }
      if (rounds == 1) {  // sortlsh, or smyrf with one round: each query meets one group, finish per chunk
        std::vector<std::pair<int64_t, int64_t>> chunks;  // (group, first member)
        for (int64_t g = 0; g < groups; ++g)
          for (size_t c0 = 0; c0 < query_members[0][g].size(); c0 += chunk) chunks.emplace_back(g, c0);
        for_each_chunk(static_cast<int64_t>(chunks.size()), [&](int64_t c, RowSums& chunk_sums) {
          const auto [g, c0] = chunks[c];
          const auto& members = query_members[0][g];
          const std::vector<int64_t> queries(members.begin() + c0,
                                             members.begin() + std::min<int64_t>(members.size(), c0 + chunk));
          run.start(queries, chunk_sums);
          run.add_group(queries, key_members[0][g], always, chunk_sums);
          return queries;
        });
        break;
      }
      // Several rounds: every (round, group) once, against its keys gathered once, minus the pairs met in
      // an earlier round; the parts merge into per-query sums under the larger of the two shifts.
      RowSums total, part;
      run.start(index_range(0, n), total);
      for (int64_t h = 0; h < rounds; ++h) {
        for (int64_t g = 0; g < groups; ++g) {
          const auto& members = query_members[h][g];
          const auto& keys = key_members[h][g];
          for (size_t c0 = 0; c0 < members.size(); c0 += chunk) {
            const std::vector<int64_t> queries(members.begin() + c0,
                                               members.begin() + std::min(members.size(), c0 + chunk));
            run.start(queries, part);
            run.add_group(
                queries, keys,
                [&](int64_t r, int64_t u) {
                  const int64_t i = queries[r], j = keys[u];
                  for (int64_t earlier = 0; earlier < h; ++earlier)
                    if (groupings.query_group[earlier][i] == groupings.key_group[earlier][j]) return false;
                  return true;
                },
                part);
            for (size_t t = 0; t < queries.size(); ++t) {
              const int64_t i = queries[t];
              const double top = std::max(total.shift(i), part.shift(t));
              const double old_factor = std::exp(total.shift(i) - top), new_factor = std::exp(part.shift(t) - top);
              total.num.row(i) = old_factor * total.num.row(i) + new_factor * part.num.row(t);
              total.feature_num.row(i) = old_factor * total.feature_num.row(i) + new_factor * part.feature_num.row(t);
              total.den(i) = old_factor * total.den(i) + new_factor * part.den(t);
              total.feature_den(i) = old_factor * total.feature_den(i) + new_factor * part.feature_den(t);
              total.shift(i) = top;
            }
          }
        }
      }
      for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        const int64_t rows = std::min(chunk, n - r0);
        sums.shift = total.shift.segment(r0, rows);
        sums.den = total.den.segment(r0, rows);
        sums.feature_den = total.feature_den.segment(r0, rows);
        sums.num = total.num.middleRows(r0, rows);
        sums.feature_num = total.feature_num.middleRows(r0, rows);
        run.finish(index_range(r0, r0 + rows), sums, out, log_denominator);
      }
      break;
    }
  }
  return out;
}

template MatrixT<float> scatterbrain_attention<float>(const ScatterbrainParams&, const HeadView&, RandomKey, VectorD*,
                                                      ThreadPool*, Precision);
template MatrixT<double> scatterbrain_attention<double>(const ScatterbrainParams&, const HeadView&, RandomKey, VectorD*,
                                                        ThreadPool*, Precision);

namespace {

class Scatterbrain final : public Estimator {
 public:
  explicit Scatterbrain(ScatterbrainParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    if (view.mask == Mask::kCausal)
      out = scatterbrain_causal_attention(params_, view, ctx.key, nullptr, ctx.precision).cast<float>();
    else
      out = scatterbrain_attention<float>(params_, view, ctx.key, nullptr, ctx.pool, ctx.precision);
  }

  // Â_ij = e_ij/D̂_i on the support S_i and φ(q_i)·φ(k_j)/D̂_i off it, with D̂_i = Σ_{j∈S_i} e_ij +
  // max(0, Σ_{j∉S_i} φ(q_i)·φ(k_j)) — estimate()'s denominator, clamp included (so a row sums to one unless
  // the clamp acts) — from the same support and features, in float64. One shift per row, max(c_i, max_S
  // s·q_i·k_j), as estimate(). Causal (the causal form's Â): keys j ≤ i only, the support cut to
  // W_i = S_i ∩ [0, i] and the complement summed over the prefix. Setup O(n·M·p) plus the support;
  // O(rows·n·(p + M)) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    const bool causal = view.mask == Mask::kCausal;
    SparseSupport support = scatterbrain_support(params_, view, ctx.key);
    const GerfMap map = scatterbrain_features(params_, view, ctx.key);
    MatrixD query_features = gerf_log_features<double>(map, view.q, view.scale, true);  // n × M
    MatrixD key_features = gerf_log_features<double>(map, view.k, view.scale, false);   // n × M
    VectorD query_shift;
    exponentiate_features<double>(query_features, key_features, &query_shift);  // φ(q_i)·φ(k_j) = e^{c_i}·φ̃·φ̃
    return [&view, support = std::move(support), query_features = std::move(query_features),
            key_features = std::move(key_features), query_shift = std::move(query_shift),
            causal](int64_t r0, int64_t rows) {
      const MatrixD logits = view.scale * (view.q.middleRows(r0, rows) * view.k.transpose());  // rows × keys
      MatrixD w = query_features.middleRows(r0, rows) * key_features.transpose();              // ê·e^{−c_i}
      const int64_t keys = w.cols();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r0 + r, begin = support.offsets[i];
        const int64_t seen = causal ? std::min(i + 1, keys) : keys;
        // The support's keys are ascending: those before `end` are the ones row i sees.
        const int64_t end = causal ? std::lower_bound(support.keys.begin() + begin,
                                                      support.keys.begin() + support.offsets[i + 1], seen) -
                                         support.keys.begin()
                                   : support.offsets[i + 1];
        w.row(r).tail(keys - seen).setZero();
        double top = query_shift(i);
        for (int64_t t = begin; t < end; ++t) top = std::max(top, logits(r, support.keys[t]));
        w.row(r) *= std::exp(query_shift(i) - top);
        double complement = w.row(r).sum(), exact = 0;
        for (int64_t t = begin; t < end; ++t) {
          const int32_t j = support.keys[t];
          complement -= w(r, j);
          w(r, j) = std::exp(logits(r, j) - top);
          exact += w(r, j);
        }
        w.row(r) /= exact + std::max(0.0, complement);
      }
      return w;
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double support = static_cast<double>(std::min<int64_t>(params_.width + 2 * params_.ext, n)) *
                           (params_.sparse == SbSupport::kSmyrf ? params_.rounds : 1);
    return 2.0 * 2.0 * n * params_.features * (p + pv) + 2.0 * n * support * (p + params_.features + 2 * pv);
  }

 private:
  ScatterbrainParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<ScatterbrainParams>{
    .name = "scatterbrain",
    .family = "sparse-lowrank",
    .summary = "Scatterbrain: exact softmax on a sparse support (local/block/sortlsh/smyrf) + random features off "
               "it (O(n (M + w) p))",
    .page = "estimators/beyond.md",
    .params =
        ParamSet<ScatterbrainParams>()
            .integer("M", &ScatterbrainParams::features, 2, 1 << 20, "random features (hyp: M/2 pairs of +-omega)")
            .choice("sparse", &ScatterbrainParams::sparse,
                    {{"local", SbSupport::kLocal},
                     {"block", SbSupport::kBlock},
                     {"sortlsh", SbSupport::kSortLsh},
                     {"smyrf", SbSupport::kSmyrf}},
                    "support: local window, query blocks, sortLSH blocks, SMYRF clusters")
            .integer("w", &ScatterbrainParams::width, 0, 1 << 24, "window / block / cluster size (0: empty support)")
            .integer("ext", &ScatterbrainParams::ext, 0, 1 << 24, "block: keys extended by ext on each side")
            .integer("rounds", &ScatterbrainParams::rounds, 1, 64, "smyrf: hashing rounds (union of clusters)")
            .choice("features", &ScatterbrainParams::kind,
                    {{"hyp", SbFeatures::kHyp}, {"pos", SbFeatures::kPos}, {"oprf", SbFeatures::kOprf}},
                    "features: hyp (fly, +-omega), pos (performer), oprf (favorpp's A*)")
            .integer("ortho", &ScatterbrainParams::orthogonal, 0, 1, "1: orthogonal blocks of features; 0: iid")
            .check([](const ScatterbrainParams& p) {
              if (p.sparse == SbSupport::kBlock && p.width == 0)
                throw UsageError("scatterbrain: sparse=block needs w >= 1 (the query block size)");
              if (p.kind == SbFeatures::kHyp && p.features % 2 != 0)  // an odd M ran M − 1 features
                throw UsageError(
                    fmt::format("scatterbrain: features=hyp draws M/2 pairs of ±ω, so M must be even (M={}); use "
                                "M={} or features=pos",
                                p.features, p.features + 1));
            }),
    .samples_knob = "M",
    .capabilities =
        {.random = true, .forms = kFullAndCausal, .weights = kFullAndCausal, .rounding = kScatterbrainRounding},
    .narrow =
        [](const ScatterbrainParams& params, Capabilities& can) {
          if (!scatterbrain_has_causal_form(params)) can.forms = kFullOnly;
        },
    .ablations = {"scatterbrain(sparse=block,ext=8)"},  // Scatterbrain's extended blocks
    .make = [](const ScatterbrainParams& params) { return std::make_unique<Scatterbrain>(params); },
});

}  // namespace
}  // namespace attnprobe
