#include "attnprobe/estimators/selection/quest/quest.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

// Channel-wise minima and maxima of keys [begin, end) of the float32 keys (exact in float64), into low[0..p) and
// high[0..p).
void key_bounds(const MatrixF& k, int64_t begin, int64_t end, float* low, float* high) {
  const int64_t p = k.cols();
  std::copy_n(k.row(begin).data(), p, low);
  std::copy_n(k.row(begin).data(), p, high);
  for (int64_t j = begin + 1; j < end; ++j) {
    const float* key = k.row(j).data();
    for (int64_t d = 0; d < p; ++d) {
      low[d] = std::min(low[d], key[d]);
      high[d] = std::max(high[d], key[d]);
    }
  }
}

// The bounds of every whole page of the slice, computed once per call and stored channel-major
// (low[d·pages + b]): a row scores all its whole pages channel by channel over contiguous pages (rows share the
// bounds; a row's partial edge pages are bounded on their own).
struct PageBounds {
  int64_t pages;
  std::vector<float> low, high;
  PageBounds(const MatrixF& k, int64_t page) : pages(k.rows() / page) {
    const int64_t p = k.cols();
    low.resize(static_cast<size_t>(p * pages));
    high.resize(low.size());
    // 16 pages at a time, so that each channel's stores fill a cache line (one page at a time, the stores 16 KiB
    // apart made the call slower than the whole slice's exact attention).
    constexpr int64_t kPagesAtOnce = 16;
    std::vector<float> page_low(kPagesAtOnce * p), page_high(kPagesAtOnce * p);
    for (int64_t b0 = 0; b0 < pages; b0 += kPagesAtOnce) {
      const int64_t count = std::min(kPagesAtOnce, pages - b0);
      for (int64_t b = 0; b < count; ++b)
        key_bounds(k, (b0 + b) * page, (b0 + b + 1) * page, &page_low[b * p], &page_high[b * p]);
      for (int64_t d = 0; d < p; ++d)
        for (int64_t b = 0; b < count; ++b) {
          low[d * pages + b0 + b] = page_low[b * p + d];
          high[d * pages + b0 + b] = page_high[b * p + d];
        }
    }
  }
};

// U_b = Σ_d max(q_d·M_bd, q_d·m_bd) in float64 of `count` pages into upper[0..count), channel d of page b at
// low[d·stride + b] and high[d·stride + b]: four interleaved partial sums per page (channel d into part d mod 4, the
// channels past the last multiple of 4 into part 0), a fixed order, as the scores. The pages sit side by side so the
// loop over them vectorises (whole pages from PageBounds), and go in blocks whose partial sums stay in the L1 cache;
// a partial edge page is one page of stride 1.
void page_bounds(const float* q, const float* low, const float* high, int64_t stride, int64_t count, int64_t p,
                 double* upper) {
  constexpr int64_t kPagesPerBlock = 512;
  const int64_t grouped = p - p % 4;
  double part[4][kPagesPerBlock];
  for (int64_t block = 0; block < count; block += kPagesPerBlock) {
    const int64_t pages = std::min(kPagesPerBlock, count - block);
    for (auto& sums : part) std::fill(sums, sums + pages, 0.0);
    for (int64_t d = 0; d < p; ++d) {
      double* sum = part[d < grouped ? d % 4 : 0];
      const double qd = q[d];
      const float* page_high = high + d * stride + block;
      const float* page_low = low + d * stride + block;
      for (int64_t b = 0; b < pages; ++b)
        sum[b] += std::max(qd * static_cast<double>(page_high[b]), qd * static_cast<double>(page_low[b]));
    }
    for (int64_t b = 0; b < pages; ++b) upper[block + b] = (part[0][b] + part[1][b]) + (part[2][b] + part[3][b]);
  }
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
      // Whole pages [whole_begin, whole_end) from the shared bounds; the partial pages at either edge on their own.
      const int64_t whole_begin = (seen.begin + page - 1) / page, whole_end = std::max(whole_begin, seen.end / page);
      for (int h = 0; h < heads.size(); ++h)
        page_bounds(heads.rows[h]->row(i).data(), bounds->low.data() + whole_begin, bounds->high.data() + whole_begin,
                    bounds->pages, whole_end - whole_begin, view.p(), upper[h].data() + (whole_begin - first));
      RowVectorF low(view.p()), high(view.p());
      for (int64_t b = first; b <= last; ++b) {
        if (b >= whole_begin && b < whole_end) continue;
        key_bounds(view.kf, std::max(seen.begin, b * page), std::min(seen.end, (b + 1) * page), low.data(),
                   high.data());
        for (int h = 0; h < heads.size(); ++h)
          page_bounds(heads.rows[h]->row(i).data(), low.data(), high.data(), 1, 1, view.p(), &upper[h][b - first]);
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
      std::sort(chosen.begin(), chosen.end());  // disjoint pages in order: the kept keys come out sorted
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
