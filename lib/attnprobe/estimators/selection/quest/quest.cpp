#include "attnprobe/estimators/selection/quest/quest.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/estimators/selection/row_blocks.h"

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
// channels past the last multiple of 4 into part 0), a fixed order, as the scores. Since M_bd ≥ m_bd, the larger
// product is q_d·M_bd when q_d ≥ 0 and q_d·m_bd otherwise (rounding keeps the order; equal bounds give equal
// products): one product per channel, of the bound its sign picks, with the same value. 16 pages at a time, their
// four sums in registers (the pages sit side by side: whole pages from PageBounds; a partial edge page is one page
// of stride 1). quest.cpp is compiled with -ffp-contract=off (lib/CMakeLists.txt) so that the product and the sum stay
// two roundings: fused into one FMA, the bounds and so the kept pages would change.
void page_bounds(const float* q, const float* low, const float* high, int64_t stride, int64_t count, int64_t p,
                 double* upper) {
  constexpr int64_t kLanes = 16;
  const int64_t grouped = p - p % 4;
  // Per channel, q_d in float64 and the bounds its sign picks.
  std::vector<double> weight(p);
  std::vector<const float*> bounds(p);
  for (int64_t d = 0; d < p; ++d) {
    weight[d] = q[d];
    bounds[d] = (weight[d] >= 0 ? high : low) + d * stride;
  }
  auto sum_pages = [&]<int64_t Lanes>(int64_t b0, std::integral_constant<int64_t, Lanes>, int64_t lanes) {
    const int64_t width = Lanes == kLanes ? kLanes : lanes;
    double part[4][Lanes] = {};
    auto add_channel = [&](int64_t d, double* sum) {
      const double qd = weight[d];
      const float* bound = bounds[d] + b0;
      for (int64_t b = 0; b < width; ++b) sum[b] += qd * static_cast<double>(bound[b]);
    };
    for (int64_t d = 0; d < grouped; d += 4)  // each part's index fixed in the code, so the sums stay in registers
      for (int64_t c = 0; c < 4; ++c) add_channel(d + c, part[c]);
    for (int64_t d = grouped; d < p; ++d) add_channel(d, part[0]);
    for (int64_t b = 0; b < lanes; ++b) upper[b0 + b] = (part[0][b] + part[1][b]) + (part[2][b] + part[3][b]);
  };
  int64_t b0 = 0;
  for (; b0 + kLanes <= count; b0 += kLanes) sum_pages(b0, std::integral_constant<int64_t, kLanes>{}, kLanes);
  if (b0 < count) sum_pages(b0, std::integral_constant<int64_t, kLanes - 1>{}, count - b0);
}

// A row's visible pages: [first, last] (index b − first in its bounds), its whole ones [whole_begin, whole_end)
// (bounded from PageBounds), the partial pages at either edge bounded on their own.
struct RowPages {
  int64_t first, last, whole_begin, whole_end;
  RowPages(KeyRange seen, int64_t page)
      : first(seen.begin / page),
        last((seen.end - 1) / page),
        whole_begin((seen.begin + page - 1) / page),
        whole_end(std::max(whole_begin, seen.end / page)) {}
  int64_t count() const { return last - first + 1; }
};

// Rows [i0, i1)'s bounds U_b of their whole pages per scoring head ([row][head][page − first], the partial pages at
// either edge left for the row): the pages go in tiles whose page bounds stay in the L2 cache while every row (and
// each of its scoring heads) sums its bounds over them, so for a block of RowBlocks the bounds (2 MiB at 65536 keys)
// are read from memory once rather than once per row: a decode step of 16 rows at 65536 keys takes 3.83 ms against
// 4.05–4.15 ms one row at a time. Each bound's sums are page_bounds' whatever the tiling, so a row's bounds are the
// same as one row at a time.
std::vector<std::vector<std::vector<double>>> whole_page_scores(const HeadView& view, const QuestParams& params,
                                                                const PageBounds& bounds, const ScoringHeads& heads,
                                                                int64_t i0, int64_t i1) {
  constexpr int64_t kPagesPerTile = 512;
  const int64_t page = params.page, rows = i1 - i0;
  std::vector<RowPages> pages;
  std::vector<std::vector<std::vector<double>>> upper(rows);
  int64_t begin = std::numeric_limits<int64_t>::max(), end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowPages& row = pages.emplace_back(view.visible(i0 + r), page);
    upper[r].assign(heads.size(), std::vector<double>(row.count()));
    if (row.whole_end > row.whole_begin) begin = std::min(begin, row.whole_begin), end = std::max(end, row.whole_end);
  }
  for (int64_t tile = begin; tile < end; tile += kPagesPerTile)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t from = std::max(tile, pages[r].whole_begin);
      const int64_t to = std::min({tile + kPagesPerTile, end, pages[r].whole_end});
      if (to <= from) continue;
      for (int h = 0; h < heads.size(); ++h)
        page_bounds(heads.rows[h]->row(i0 + r).data(), bounds.low.data() + from, bounds.high.data() + from,
                    bounds.pages, to - from, view.p(), upper[r][h].data() + (from - pages[r].first));
    }
  return upper;
}

class Quest final : public KeptKeysEstimator {
 public:
  explicit Quest(QuestParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    auto bounds = std::make_shared<const PageBounds>(view.kf, params_.page);
    auto shared_heads = std::make_shared<const ScoringHeads>(scoring_heads(view, params_.share));
    auto scores = std::make_shared<RowBlocks<std::vector<std::vector<double>>>>(
        view.n(), [&view, params = params_, bounds, shared_heads](int64_t i0, int64_t i1) {
          return whole_page_scores(view, params, *bounds, *shared_heads, i0, i1);
        });
    return [&view, params = params_, shared_heads, scores, precision = ctx.precision](int64_t i) {
      const ScoringHeads& heads = *shared_heads;
      const KeyRange seen = view.visible(i);
      const int64_t page = params.page;
      const RowPages row(seen, page);
      const int64_t first = row.first, last = row.last, pages = row.count();
      // U_b of each page (index b − first), its keys clipped to the row's, for each scoring head's query: the whole
      // pages from the shared bounds, the partial pages at either edge on their own.
      std::vector<std::vector<double>> upper = scores->take(i);
      RowVectorF low(view.p()), high(view.p());
      for (int64_t b = first; b <= last; ++b) {
        if (b >= row.whole_begin && b < row.whole_end) continue;
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
