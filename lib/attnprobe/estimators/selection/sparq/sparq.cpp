#include "attnprobe/estimators/selection/sparq/sparq.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

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

// ŝ_j = q_I·k_{j,I} / τ over the keys [seen.begin, seen.end) (index j − seen.begin), τ = √(p·‖q_I‖₁/‖q‖₁), float64
// sums over the channels in ascending order; all zero for a query whose chosen channels are all zero.
std::vector<double> approximate_logits(const float* q, const MatrixF& k, KeyRange seen,
                                       const std::vector<int64_t>& channels, int64_t p) {
  double norm = 0, covered = 0;
  for (int64_t d = 0; d < p; ++d) norm += std::abs(static_cast<double>(q[d]));
  for (int64_t d : channels) covered += std::abs(static_cast<double>(q[d]));
  std::vector<double> scores(seen.size(), 0.0);
  if (covered == 0) return scores;
  const double tau = std::sqrt(static_cast<double>(p) * covered / norm);
  for (int64_t j = seen.begin; j < seen.end; ++j) {
    const float* key = k.row(j).data();
    double dot = 0;
    for (int64_t d : channels) dot += static_cast<double>(q[d]) * static_cast<double>(key[d]);
    scores[j - seen.begin] = dot / tau;
  }
  return scores;
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
    return [&view, params = params_, prefix, precision = ctx.precision](int64_t i) {
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
      const std::vector<int64_t> rest = keys_outside(seen, kept.keys);
      const ScoringHeads heads = scoring_heads(view, params.share);
      const std::vector<int64_t> channels = top_channels(heads, i, p, r);
      std::vector<std::vector<double>> scores;
      int own = 0;
      for (int h = 0; h < heads.size(); ++h) {
        if (heads.rows[h] == &view.qf) own = h;
        scores.push_back(approximate_logits(heads.rows[h]->row(i).data(), view.kf, seen, channels, p));
      }
      // α needs the own head's ŝ over all of V_t; aggregate_scores may overwrite the candidates' entries.
      std::vector<double> own_scores = params.realloc ? scores[own] : std::vector<double>();
      const std::vector<double> shared =
          aggregate_scores(std::move(scores), rest, seen.begin, params.agg, /*logits=*/true);
      const int64_t wanted = params.k - static_cast<int64_t>(kept.keys.size());
      const std::vector<int64_t> best = best_by_score(rest, shared, seen.begin, wanted, precision, &kept.ties);
      kept.keys.insert(kept.keys.end(), best.begin(), best.end());
      finish_kept(kept.keys);
      if (params.realloc) {
        Completion mean{0.0, true, prefix->mean(seen), {}};
        if (kept.keys.empty())  // α = 0: the value mean alone (absolute log-mass 0, the only term)
          mean.relative = false;
        else
          mean.log_mass = log_dropped_over_kept(own_scores, seen, kept.keys);
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
