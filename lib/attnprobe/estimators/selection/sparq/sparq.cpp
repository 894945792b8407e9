#include "attnprobe/estimators/selection/sparq/sparq.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/estimators/selection/row_blocks.h"

namespace attnprobe {
namespace {

// The r channels with the largest Σ_h |q^{(h)}_{t,d}| over the scoring heads (one head: its own |q_{t,d}|), by
// (magnitude descending, channel ascending), returned ascending so every score sums them in one fixed order.
std::vector<int64_t> top_channels(const ScoringHeads& heads, int64_t row, int64_t p, int64_t r) {
  std::vector<double> magnitude(p, 0.0);
  for (const MatrixF* rows : heads.rows)
    for (int64_t d = 0; d < p; ++d) magnitude[d] += std::abs(static_cast<double>((*rows)(row, d)));
  std::vector<int64_t> channels(p);
  std::iota(channels.begin(), channels.end(), int64_t{0});
  if (r < p) {
    std::nth_element(channels.begin(), channels.begin() + r, channels.end(), [&](int64_t a, int64_t b) {
      return magnitude[a] > magnitude[b] || (magnitude[a] == magnitude[b] && a < b);
    });
    channels.resize(r);
    std::sort(channels.begin(), channels.end());
  }
  return channels;
}

// Rows [i0, i1)'s approximate logits per scoring head ([row][head][j − seen.begin]; none for a row that keeps every
// key it sees): ŝ_j = q_I·k_{j,I} / τ with I the row's top_channels, τ = √(p·‖q_I‖₁/‖q‖₁), each a float64 sum over
// the channels in ascending order, starting from 0, then one division; all zero for a query whose chosen channels
// are all zero. The keys go in tiles, widened channel-major (the channels some row uses), while every row of the
// block sums its scores over the tile, each key's chain in a vector lane: a decode step reads the keys once for all
// its rows (key by key for each row, every key row was read whole 16 times, and each key's chain of r dependent
// multiply-adds waited on the last). The chains are the same operations in the same order whatever the tiling, so a
// row's scores are those it has alone.
std::vector<std::vector<std::vector<double>>> approximate_logits(const HeadView& view, const ScoringHeads& heads,
                                                                 const SparqParams& params, int64_t i0, int64_t i1) {
  constexpr int64_t kKeysPerTile = 128;
  const int64_t p = view.p(), rows = i1 - i0, r = std::min(params.r, p);
  struct RowQuery {
    KeyRange seen;
    std::vector<int64_t> channels;
    std::vector<std::vector<double>> weights;  ///< [head][c]: q_{channels[c]} widened
    std::vector<double> tau;                   ///< per head; 0: the head's scores stay zero
  };
  std::vector<RowQuery> queries(rows);
  std::vector<std::vector<std::vector<double>>> logits(rows);
  std::vector<char> used(p, 0);
  int64_t begin = std::numeric_limits<int64_t>::max(), end = 0;
  for (int64_t row = 0; row < rows; ++row) {
    RowQuery& query = queries[row];
    query.seen = view.visible(i0 + row);
    if (params.k >= query.seen.size()) continue;  // kept whole: nothing ranked
    query.channels = top_channels(heads, i0 + row, p, r);
    for (int64_t d : query.channels) used[d] = 1;
    begin = std::min(begin, query.seen.begin), end = std::max(end, query.seen.end);
    for (int h = 0; h < heads.size(); ++h) {
      const float* q = heads.rows[h]->row(i0 + row).data();
      double norm = 0, covered = 0;
      for (int64_t d = 0; d < p; ++d) norm += std::abs(static_cast<double>(q[d]));
      for (int64_t d : query.channels) covered += std::abs(static_cast<double>(q[d]));
      query.tau.push_back(covered == 0 ? 0.0 : std::sqrt(static_cast<double>(p) * covered / norm));
      std::vector<double>& weight = query.weights.emplace_back();
      for (int64_t d : query.channels) weight.push_back(static_cast<double>(q[d]));
      logits[row].emplace_back(query.seen.size(), 0.0);
    }
  }
  std::vector<int64_t> channels_used;
  for (int64_t d = 0; d < p; ++d)
    if (used[d]) channels_used.push_back(d);
  std::vector<double> tile(static_cast<size_t>(p * kKeysPerTile)), dot(kKeysPerTile);
  for (int64_t j0 = begin; j0 < end; j0 += kKeysPerTile) {
    const int64_t j1 = std::min(end, j0 + kKeysPerTile);
    const float* keys = view.kf.row(j0).data();
    for (int64_t d : channels_used) {  // a channel's column at a time: contiguous stores, gathered loads
      double* column = tile.data() + d * kKeysPerTile;
      for (int64_t l = 0; l < j1 - j0; ++l) column[l] = static_cast<double>(keys[l * p + d]);
    }
    for (int64_t row = 0; row < rows; ++row) {
      const RowQuery& query = queries[row];
      const int64_t from = std::max(j0, query.seen.begin) - j0, to = std::min(j1, query.seen.end) - j0;
      if (query.channels.empty() || to <= from) continue;
      for (size_t h = 0; h < query.tau.size(); ++h) {
        if (query.tau[h] == 0) continue;
        std::fill(dot.begin() + from, dot.begin() + to, 0.0);
        for (size_t c = 0; c < query.channels.size(); ++c) {
          const double weight = query.weights[h][c];
          const double* column = tile.data() + query.channels[c] * kKeysPerTile;
          for (int64_t l = from; l < to; ++l) dot[l] += weight * column[l];
        }
        double* out = logits[row][h].data();  // key j0 + l at j0 + l − seen.begin
        for (int64_t l = from; l < to; ++l) out[j0 + l - query.seen.begin] = dot[l] / query.tau[h];
      }
    }
  }
  return logits;
}

// log((1 − α)/α) with α = Σ_S softmax_{V_t}(ŝ)_j: the log of the dropped keys' exponential sum over the kept
// keys', each summed on its own (1 − α by subtraction would cancel when α ≈ 1). `kept` ascending, inside `seen`.
double log_dropped_over_kept(const std::vector<double>& scores, KeyRange seen, const std::vector<int64_t>& kept) {
  const double top = *std::max_element(scores.begin(), scores.end());
  double in = 0, out = 0;
  size_t next = 0;
  for (int64_t j = seen.begin; j < seen.end; ++j) {
    const double e = std::exp(scores[j - seen.begin] - top);
    if (next < kept.size() && kept[next] == j) {
      in += e;
      ++next;
    } else {
      out += e;
    }
  }
  return std::log(out) - std::log(in);
}

// Prefix sums of the float32 values in float64, Σ_{j' < j} v_j', kept only at the bounds of the view's rows' visible
// ranges: the mean over any of those ranges in O(pv). One pass over the keys in order, so each kept prefix has the bits
// of a full prefix table (a decode step of 16 rows keeps 17 prefixes, not one per cached key: a 65536-key table was
// 33 MiB zeroed and faulted in on every call). Each prefix depends on the keys before it only, so a row's v̄_t never
// reads a key after t.
struct ValuePrefix {
  std::vector<int64_t> bounds;  ///< ascending
  MatrixD sums;                 ///< row b: the sum of the values before key bounds[b]
  explicit ValuePrefix(const HeadView& view) {
    for (int64_t i = 0; i < view.n(); ++i) {
      const KeyRange seen = view.visible(i);
      bounds.push_back(seen.begin);
      bounds.push_back(seen.end);
    }
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    sums.resize(static_cast<int64_t>(bounds.size()), view.pv());
    RowVectorD running = RowVectorD::Zero(view.pv());
    int64_t j = 0;
    for (size_t b = 0; b < bounds.size(); ++b) {
      for (; j < bounds[b]; ++j) running += view.vf.row(j).cast<double>();
      sums.row(static_cast<int64_t>(b)) = running;
    }
  }
  RowVectorD mean(KeyRange seen) const {
    return (sum_before(seen.end) - sum_before(seen.begin)) / static_cast<double>(seen.size());
  }

 private:
  RowVectorD sum_before(int64_t key) const {
    return sums.row(std::lower_bound(bounds.begin(), bounds.end(), key) - bounds.begin());
  }
};

class Sparq final : public KeptKeysEstimator {
 public:
  explicit Sparq(SparqParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    auto prefix = params_.realloc ? std::make_shared<const ValuePrefix>(view) : nullptr;
    auto shared_heads = std::make_shared<const ScoringHeads>(scoring_heads(view, params_.share));
    auto logits = std::make_shared<RowBlocks<std::vector<std::vector<double>>>>(
        view.n(), [&view, params = params_, shared_heads](int64_t i0, int64_t i1) {
          return approximate_logits(view, *shared_heads, params, i0, i1);
        });
    return [&view, params = params_, prefix, shared_heads, logits, precision = ctx.precision](int64_t i) {
      const KeyRange seen = view.visible(i);
      const int64_t p = view.p(), r = std::min(params.r, p);
      // keys_scored: the partial keys of r channels, r/p of a key each, over every key the row sees.
      KeptKeys kept{{}, {}, static_cast<double>(seen.size()) * static_cast<double>(r) / static_cast<double>(p)};
      if (params.k >= seen.size()) {  // every key: exact, α = 1, no completion
        append_range(kept.keys, seen.begin, seen.end);
        return kept;
      }
      const int64_t t = view.position(i);
      append_range(kept.keys, std::max(seen.begin, t - params.window + 1), std::min(seen.end, t + 1));
      std::vector<int64_t> rest = keys_outside(seen, kept.keys);
      const ScoringHeads& heads = *shared_heads;
      std::vector<std::vector<double>> scores = logits->take(i);
      int own = 0;
      for (int h = 0; h < heads.size(); ++h)
        if (heads.rows[h] == &view.qf) own = h;
      // α needs the own head's ŝ over all of V_t; aggregate_scores may overwrite the candidates' entries (one head:
      // it hands them back as they are).
      const bool alone = scores.size() == 1;
      std::vector<double> own_scores = params.realloc && !alone ? scores[own] : std::vector<double>();
      const std::vector<double> shared =
          aggregate_scores(std::move(scores), rest, seen.begin, params.agg, /*logits=*/true);
      const std::vector<double>& own_logits = alone ? shared : own_scores;
      const int64_t wanted = params.k - static_cast<int64_t>(kept.keys.size());
      const std::vector<int64_t> best =
          best_by_score(std::move(rest), shared, seen.begin, wanted, precision, &kept.ties);
      kept.keys.insert(kept.keys.begin(), best.begin(), best.end());  // older than the window: no sort needed
      finish_kept(kept.keys);
      if (params.realloc) {
        Completion mean{0.0, true, prefix->mean(seen), {}};
        if (kept.keys.empty())  // α = 0: the value mean alone (absolute log-mass 0, the only term)
          mean.relative = false;
        else
          mean.log_mass = log_dropped_over_kept(own_logits, seen, kept.keys);
        kept.completions.push_back(std::move(mean));
      }
      return kept;
    };
  }
  // Per row: the approximate scores (r of p channels per visible key), the kept keys' logits and values.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.k));
    const double r = static_cast<double>(std::min(params_.r, p));
    return 2.0 * n * (static_cast<double>(n) * r + kept * (p + pv));
  }

 private:
  SparqParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<SparqParams>{
    .name = "sparq",
    .family = "selection",
    .summary = "SparQ: keys ranked by approximate logits from the query's r largest channels, the window kept, "
               "the value mean taking the missing mass",
    .page = "estimators/selection.md",
    .params = with_sharing(ParamSet<SparqParams>()
                               .integer("r", &SparqParams::r, 1, int64_t{1} << 20,
                                        "query channels the approximate scores read (>= the head size: all)")
                               .integer("k", &SparqParams::k, 0, int64_t{1} << 30,
                                        "keys attended, the window's included (>= the keys seen: exact)")
                               .integer("window", &SparqParams::window, 0, int64_t{1} << 30,
                                        "the last keys up to the query's own, always kept")
                               .integer("realloc", &SparqParams::realloc, 0, 1,
                                        "1: the value mean over the keys seen takes the mass the kept keys lack "
                                        "by the approximate scores; 0: softmax over the kept keys"))
                  .check([](const SparqParams& p) {
                    require_usage(p.k >= p.window,
                                  "sparq: k={} is below window={}; k counts the window's keys (raise k, or lower "
                                  "the window)",
                                  p.k, p.window);
                  }),
    .samples_knob = "k",
    .capabilities = ranking_scores_rounded(
        {.random = false, .forms = kAllMasks, .decode = kAllMasks, .weights = kAllMasks, .selection = true}),
    .narrow =
        [](const SparqParams& params, Capabilities& can) {
          positional_forms(0, params.window, can);
          narrow_sharing(params, can);
        },
    .ablations = {"sparq(r=4,k=32,window=8,realloc=0)", "sparq(r=4,k=32,window=8,share=head)",
                  "sparq(r=4,k=32,window=8,agg=mean)", "sparq(r=4,k=32,window=0)"},
    .make = [](const SparqParams& params) { return std::make_unique<Sparq>(params); },
});

}  // namespace
}  // namespace attnprobe
