#include "attnprobe/estimators/selection/quest/quest.h"

#include <algorithm>
#include <memory>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

// Channel-wise minima and maxima of keys [begin, end) of the float32 keys (exact in float64).
void key_bounds(const MatrixF& k, int64_t begin, int64_t end, RowVectorF& low, RowVectorF& high) {
  low = k.row(begin);
  high = k.row(begin);
  for (int64_t j = begin + 1; j < end; ++j) {
    low = low.cwiseMin(k.row(j));
    high = high.cwiseMax(k.row(j));
  }
}

// The bounds of every whole page of the slice, computed once per call: rows share them (a row's partial edge
// pages are bounded on their own).
struct PageBounds {
  std::vector<RowVectorF> low, high;
  PageBounds(const MatrixF& k, int64_t page) {
    const int64_t whole = k.rows() / page;
    low.resize(whole);
    high.resize(whole);
    for (int64_t b = 0; b < whole; ++b) key_bounds(k, b * page, (b + 1) * page, low[b], high[b]);
  }
};

// U_b = Σ_d max(q_d·M_d, q_d·m_d) in float64, four interleaved partial sums (a fixed order, as the scores).
double page_bound(const float* q, const float* low, const float* high, int64_t p) {
  double part[4] = {0, 0, 0, 0};
  int64_t d = 0;
  const auto term = [&](int64_t c) {
    const double qc = q[c];
    return std::max(qc * static_cast<double>(high[c]), qc * static_cast<double>(low[c]));
  };
  for (; d + 4 <= p; d += 4)
    for (int l = 0; l < 4; ++l) part[l] += term(d + l);
  for (; d < p; ++d) part[0] += term(d);
  return (part[0] + part[1]) + (part[2] + part[3]);
}

class Quest final : public KeptKeysEstimator {
 public:
  explicit Quest(QuestParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    auto bounds = std::make_shared<const PageBounds>(view.kf, params_.page);
    return [&view, params = params_, bounds, precision = ctx.precision](int64_t i) {
      const KeyRange seen = view.visible(i);
      const int64_t page = params.page, first = seen.begin / page, last = (seen.end - 1) / page;
      const int64_t pages = last - first + 1;
      // U_b of each page (index b − first), its keys clipped to the row's, for each scoring head's query.
      const ScoringHeads heads = scoring_heads(view, params.share);
      std::vector<std::vector<double>> upper(heads.size(), std::vector<double>(pages));
      RowVectorF low, high;
      for (int64_t b = first; b <= last; ++b) {
        const int64_t begin = std::max(seen.begin, b * page), end = std::min(seen.end, (b + 1) * page);
        const bool whole = begin == b * page && end == (b + 1) * page;
        if (!whole) key_bounds(view.kf, begin, end, low, high);
        for (int h = 0; h < heads.size(); ++h) {
          const float* q = heads.rows[h]->row(i).data();
          upper[h][b - first] = whole ? page_bound(q, bounds->low[b].data(), bounds->high[b].data(), view.p())
                                      : page_bound(q, low.data(), high.data(), view.p());
        }
      }
      const int64_t wanted = std::min(params.budget, seen.size());
      int64_t n = params.round == QuestRound::kCeil ? (wanted + page - 1) / page : wanted / page;
      n = std::min(std::max(params.min_pages, n), pages);
      // A budget that covers the row keeps it whole (a window's keys can straddle one page more than they fill).
      if (params.round == QuestRound::kCeil && params.budget >= seen.size()) n = pages;
      std::vector<int64_t> chosen;  // absolute page numbers
      std::vector<int64_t> candidates;
      const int64_t own = view.position(i) / page;
      for (int64_t b = first; b <= last; ++b)
        if (!(params.last && b == own)) candidates.push_back(b);
      if (params.last && n > 0) chosen.push_back(own);
      if (heads.size() > 1)  // the group's aggregate of the logit bounds s·U_b over the competing pages
        for (std::vector<double>& bound : upper)
          for (double& u : bound) u *= view.scale;
      const std::vector<double> score = aggregate_scores(std::move(upper), candidates, first, params.agg, true);
      KeptKeys kept{{}, {}, 2.0 * static_cast<double>(pages)};
      const std::vector<int64_t> best = best_by_score(std::move(candidates), score, first,
                                                      n - static_cast<int64_t>(chosen.size()), precision, &kept.ties);
      chosen.insert(chosen.end(), best.begin(), best.end());
      for (int64_t b : chosen)
        append_range(kept.keys, std::max(seen.begin, b * page), std::min(seen.end, (b + 1) * page));
      finish_kept(kept.keys);
      return kept;
    };
  }
  // Per row: every page's bound (2·p per page, whole pages' bounds shared), then the kept keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double kept = static_cast<double>(std::min(n, params_.budget + params_.page));
    return 2.0 * n * (2.0 * static_cast<double>(n) / static_cast<double>(params_.page) * p + kept * (p + pv));
  }

 private:
  QuestParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<QuestParams>{
    .name = "quest",
    .family = "selection",
    .summary = "Quest: pages of keys scored by an upper bound from their channel-wise min and max; the best pages "
               "up to a key budget",
    .page = "estimators/selection.md",
    .params = with_sharing(
        ParamSet<QuestParams>()
            .integer("page", &QuestParams::page, 1, int64_t{1} << 20, "keys per page")
            .integer("budget", &QuestParams::budget, 0, int64_t{1} << 30,
                     "keys the kept pages should hold (the samples knob)")
            .integer("last", &QuestParams::last, 0, 1,
                     "1: always the query's own page plus the best others (Quest's kernel); 0: the best "
                     "pages, its own competing (the evaluation code)")
            .choice("round", &QuestParams::round, {{"ceil", QuestRound::kCeil}, {"floor", QuestRound::kFloor}},
                    "pages = budget/page rounded up (exact when the budget covers the keys) or down (the "
                    "reference)")
            .integer("min_pages", &QuestParams::min_pages, 0, int64_t{1} << 20, "the fewest pages kept")),
    .samples_knob = "budget",
    .capabilities = ranking_scores_rounded(
        {.random = false, .forms = kAllMasks, .decode = kAllMasks, .weights = kAllMasks, .selection = true}),
    // The query's own page is a position: the full mask has none.
    .narrow =
        [](const QuestParams& params, Capabilities& can) {
          if (params.last) can.forms = can.decode = can.weights = {Mask::kCausal, Mask::kWindow};
          narrow_sharing(params, can);
        },
    .ablations = {"quest(last=1)", "quest(page=8,budget=32,share=group,agg=logit)"},
    .make = [](const QuestParams& params) { return std::make_unique<Quest>(params); },
});

}  // namespace
}  // namespace attnprobe
