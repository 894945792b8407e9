// The selection family (docs/estimators/selection.md) against float64 implementations written here from the
// definitions — a row's kept set and its softmax over that set — and the family's identities: budgets that cover
// every key are exact, topk(k=0) is streaming, the error is the tail (1 − m)(μ_T − μ_S), ties keep the older key.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/estimators/selection/snapkv/snapkv.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/metrics/selection_metrics.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

// The keys row i sees, from the mask's definition (docs/specs.md, "Masks and query rows").
std::vector<int64_t> seen_keys(const HeadView& view, int64_t i) {
  const int64_t t = view.position(i), n = view.k.rows();
  int64_t lo = 0, hi = n;
  if (view.mask != Mask::kFull) hi = std::min(t + 1, n);
  if (view.mask == Mask::kWindow) lo = std::max<int64_t>(0, t - view.window + 1);
  std::vector<int64_t> keys(hi - lo);
  std::iota(keys.begin(), keys.end(), lo);
  return keys;
}

// Scores are float64 sums of the float32 inputs (what a device holds too).
double logit(const HeadView& view, int64_t i, int64_t j) {
  return view.scale * view.qf.row(i).cast<double>().dot(view.kf.row(j).cast<double>());
}

// The sink and window keys among `seen` (window counts the query's own key).
std::vector<int64_t> fixed_part(const HeadView& view, int64_t i, const std::vector<int64_t>& seen, int64_t sink,
                                int64_t window) {
  const int64_t t = view.position(i);
  std::vector<int64_t> fixed;
  for (int64_t j : seen)
    if (j < sink || (j > t - window && j <= t)) fixed.push_back(j);
  return fixed;
}

// The rest, ordered by (logit descending, index ascending).
std::vector<int64_t> ranked_rest(const HeadView& view, int64_t i, const std::vector<int64_t>& seen,
                                 const std::vector<int64_t>& fixed) {
  std::vector<int64_t> rest;
  for (int64_t j : seen)
    if (!std::binary_search(fixed.begin(), fixed.end(), j)) rest.push_back(j);
  std::stable_sort(rest.begin(), rest.end(),
                   [&](int64_t a, int64_t b) { return logit(view, i, a) > logit(view, i, b); });
  return rest;
}

std::vector<int64_t> topk_set(const HeadView& view, int64_t i, int64_t k, int64_t sink, int64_t window) {
  const auto seen = seen_keys(view, i);
  std::vector<int64_t> kept = fixed_part(view, i, seen, sink, window);
  const auto rest = ranked_rest(view, i, seen, kept);
  kept.insert(kept.end(), rest.begin(), rest.begin() + std::min<int64_t>(k, static_cast<int64_t>(rest.size())));
  std::sort(kept.begin(), kept.end());
  return kept;
}

// topp; strict: a port of the sparse-attention hub's OracleTopPMasker — cumsum / total, searchsorted(side =
// "right") for the first prefix above p, then every key whose mass is at least that key's.
std::vector<int64_t> topp_set(const HeadView& view, int64_t i, double p, int64_t sink, int64_t window, bool strict) {
  const auto seen = seen_keys(view, i);
  std::vector<int64_t> kept = fixed_part(view, i, seen, sink, window);
  const auto rest = ranked_rest(view, i, seen, kept);
  if (!rest.empty()) {
    std::vector<double> mass(rest.size());
    for (size_t r = 0; r < rest.size(); ++r) mass[r] = std::exp(logit(view, i, rest[r]) - logit(view, i, rest[0]));
    const double total = std::accumulate(mass.begin(), mass.end(), 0.0);
    std::vector<double> cumulative(rest.size());
    std::partial_sum(mass.begin(), mass.end(), cumulative.begin());
    for (double& c : cumulative) c /= total;
    if (p >= 1) {
      kept.insert(kept.end(), rest.begin(), rest.end());
    } else if (strict) {
      const size_t first_above = std::upper_bound(cumulative.begin(), cumulative.end(), p) - cumulative.begin();
      const double threshold = mass[std::min(first_above, rest.size() - 1)];
      for (size_t r = 0; r < rest.size(); ++r)
        if (mass[r] >= threshold) kept.push_back(rest[r]);
    } else {
      size_t count = 0;
      while (count < rest.size() && !(count > 0 && cumulative[count - 1] >= p) && p > 0) ++count;
      kept.insert(kept.end(), rest.begin(), rest.begin() + static_cast<int64_t>(count));
    }
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

// Quest from its definition: pages of `page` keys aligned to key 0, clipped to the keys the row sees; each scored
// by U_b = Σ_d max(q_d·max_j k_jd, q_d·min_j k_jd) over its keys; n pages by the budget's rounding, at least
// min_pages and at most all; the best by (U desc, page asc), or (last) the query's page and the best others.
std::vector<int64_t> quest_set(const HeadView& view, int64_t i, int64_t page, int64_t budget, bool last, bool floor,
                               int64_t min_pages) {
  const auto seen = seen_keys(view, i);
  std::vector<int64_t> pages;
  for (int64_t j : seen)
    if (pages.empty() || pages.back() != j / page) pages.push_back(j / page);
  std::vector<double> upper;
  for (int64_t b : pages) {
    double u = 0;
    for (int64_t d = 0; d < view.p(); ++d) {
      double hi = -INFINITY, lo = INFINITY;
      for (int64_t j : seen)
        if (j / page == b) hi = std::max<double>(hi, view.kf(j, d)), lo = std::min<double>(lo, view.kf(j, d));
      const double q = view.qf(i, d);
      u += std::max(q * hi, q * lo);
    }
    upper.push_back(u);
  }
  const int64_t wanted = std::min<int64_t>(budget, static_cast<int64_t>(seen.size()));
  int64_t n = floor ? wanted / page : (wanted + page - 1) / page;
  n = std::min<int64_t>(std::max(min_pages, n), static_cast<int64_t>(pages.size()));
  if (!floor && budget >= static_cast<int64_t>(seen.size())) n = static_cast<int64_t>(pages.size());
  std::vector<size_t> order(pages.size());
  std::iota(order.begin(), order.end(), 0);
  const int64_t own = view.position(i) / page;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (last && (pages[a] == own) != (pages[b] == own)) return pages[a] == own;  // the query's page first
    return upper[a] > upper[b];
  });
  std::vector<int64_t> kept;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j : seen)
      if (j / page == pages[order[r]]) kept.push_back(j);
  std::sort(kept.begin(), kept.end());
  return kept;
}

// MoBA from its definition: the query's block up to itself and the topk − 1 complete past blocks with the largest
// gate s·q·mean(block keys), ties to the older block.
std::vector<int64_t> moba_set(const HeadView& view, int64_t i, int64_t block, int64_t topk) {
  const int64_t t = view.position(i), own = t / block;
  std::vector<int64_t> past(own);
  std::iota(past.begin(), past.end(), 0);
  std::vector<double> gate(own);
  for (int64_t b = 0; b < own; ++b)
    gate[b] = view.scale *
              view.qf.row(i).cast<double>().dot(view.kf.middleRows(b * block, block).cast<double>().colwise().mean());
  std::stable_sort(past.begin(), past.end(), [&](int64_t a, int64_t b) { return gate[a] > gate[b]; });
  past.resize(std::min<int64_t>(own, topk - 1));
  std::vector<int64_t> kept;
  for (int64_t b : past)
    for (int64_t j = b * block; j < (b + 1) * block; ++j) kept.push_back(j);
  for (int64_t j = own * block; j <= t; ++j) kept.push_back(j);
  std::sort(kept.begin(), kept.end());
  return kept;
}

// Row i's softmax over `kept` applied to V, float64.
RowVectorD attend(const HeadView& view, int64_t i, const std::vector<int64_t>& kept) {
  RowVectorD out = RowVectorD::Zero(view.pv());
  if (kept.empty()) return out;
  double top = -INFINITY, total = 0;
  for (int64_t j : kept) top = std::max(top, logit(view, i, j));
  for (int64_t j : kept) {
    const double w = std::exp(logit(view, i, j) - top);
    out += w * view.v.row(j);
    total += w;
  }
  return out / total;
}

HeadView masked_slice(int64_t n, int p, Mask mask, int64_t window, uint64_t seed) {
  HeadView view = synth_slice(n, p, 0.3, seed, p + 3);
  view.mask = mask;
  view.window = window;
  return view;
}

struct Setting {
  std::string spec;
  std::function<std::vector<int64_t>(const HeadView&, int64_t)> kept;
  Mask mask;
};

}  // namespace

TEST_CASE("selection estimators keep the sets their definitions give, and attend them exactly", "[selection]") {
  const std::vector<Setting> settings = {
      {"topk(k=7)", [](const HeadView& v, int64_t i) { return topk_set(v, i, 7, 0, 0); }, Mask::kFull},
      {"topk(k=7)", [](const HeadView& v, int64_t i) { return topk_set(v, i, 7, 0, 0); }, Mask::kCausal},
      {"topk(k=5,sink=3,window=9)", [](const HeadView& v, int64_t i) { return topk_set(v, i, 5, 3, 9); },
       Mask::kCausal},
      {"topk(k=5,sink=3,window=9)", [](const HeadView& v, int64_t i) { return topk_set(v, i, 5, 3, 9); },
       Mask::kWindow},
      {"topp(p=0.8)", [](const HeadView& v, int64_t i) { return topp_set(v, i, 0.8, 0, 0, false); }, Mask::kFull},
      {"topp(p=0.8,sink=2,window=4)", [](const HeadView& v, int64_t i) { return topp_set(v, i, 0.8, 2, 4, false); },
       Mask::kCausal},
      {"topp(p=0.6,strict=1)", [](const HeadView& v, int64_t i) { return topp_set(v, i, 0.6, 0, 0, true); },
       Mask::kCausal},
      {"topp(p=0)", [](const HeadView& v, int64_t i) { return topp_set(v, i, 0, 0, 0, false); }, Mask::kFull},
      {"streaming(sink=4,window=16)", [](const HeadView& v, int64_t i) { return topk_set(v, i, 0, 4, 16); },
       Mask::kCausal},
      {"streaming(sink=2,window=5)", [](const HeadView& v, int64_t i) { return topk_set(v, i, 0, 2, 5); },
       Mask::kWindow},
      {"quest(page=8,budget=30)", [](const HeadView& v, int64_t i) { return quest_set(v, i, 8, 30, false, false, 3); },
       Mask::kFull},
      {"quest(page=8,budget=30)", [](const HeadView& v, int64_t i) { return quest_set(v, i, 8, 30, false, false, 3); },
       Mask::kCausal},
      {"quest(page=6,budget=20,last=1,min_pages=1)",
       [](const HeadView& v, int64_t i) { return quest_set(v, i, 6, 20, true, false, 1); }, Mask::kWindow},
      {"quest(page=16,budget=40,round=floor)",
       [](const HeadView& v, int64_t i) { return quest_set(v, i, 16, 40, false, true, 3); }, Mask::kCausal},
      {"moba(block=8,topk=3)", [](const HeadView& v, int64_t i) { return moba_set(v, i, 8, 3); }, Mask::kCausal},
      {"moba(block=20,topk=2)", [](const HeadView& v, int64_t i) { return moba_set(v, i, 20, 2); }, Mask::kCausal},
  };
  for (const Setting& s : settings)
    for (const bool decode : {false, true}) {
      const HeadView whole = masked_slice(150, 12, s.mask, 40, 5);
      const HeadView view = decode ? last_rows(whole, 9) : whole;
      INFO(s.spec << " under " << mask_name(s.mask) << (decode ? ", the last 9 rows" : ""));
      const MatrixF out = run_estimator(s.spec, view);
      double worst = 0;
      int64_t set_mismatches = 0;
      for (int64_t i = 0; i < view.n(); ++i) {
        const std::vector<int64_t> kept = s.kept(view, i);
        set_mismatches += stated_set(s.spec, view, i) != kept;
        const RowVectorD expected = attend(view, i, kept);
        worst = std::max(worst, (out.row(i).cast<double>() - expected).norm() / std::max(expected.norm(), 1e-300));
      }
      CHECK(set_mismatches == 0);
      CHECK(worst < 1e-5);  // float32 attention of the same keys: observed ≤ 3.5e-7 per row
    }
}

TEST_CASE("budgets that cover every key are exact attention", "[selection]") {
  for (const Mask mask : {Mask::kFull, Mask::kCausal, Mask::kWindow}) {
    const HeadView view = masked_slice(200, 16, mask, 50, 9);
    INFO(mask_name(mask));
    const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry());
    std::vector<std::string> specs = {"topk(k=200)", "topp(p=1)", "quest(page=16,budget=200)"};
    if (mask != Mask::kFull) specs.push_back("streaming(sink=0,window=200)");
    if (mask == Mask::kCausal) specs.push_back("moba(block=16,topk=13)");  // 12 past blocks at most
    for (const std::string& spec : specs) {
      const auto estimator = make_estimator(parse_spec(spec), Device::kCpu);
      const MatrixD weights = estimator->weights(view, {make_random_key(1, spec, 0)})(0, view.n());
      const MatrixD via_weights = weights * view.v;
      const double error = (via_weights - exact).norm() / exact.norm();
      const double error32 = (run_estimator(spec, view).cast<double>() - exact).norm() / exact.norm();
      INFO(spec << ": float64 weights " << error << ", float32 output " << error32);
      CHECK(error < 1e-12);   // the same softmax in another order: observed ≤ 4.5e-16
      CHECK(error32 < 1e-5);  // float32: observed ≤ 3.1e-7
    }
  }
}

TEST_CASE("quest with one-key pages and moba with one-key blocks are topk", "[selection]") {
  const HeadView view = masked_slice(160, 16, Mask::kCausal, 0, 13);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    mismatches += stated_set("quest(page=1,budget=9,min_pages=1)", view, i) != stated_set("topk(k=9)", view, i);
    mismatches += stated_set("moba(block=1,topk=9)", view, i) != stated_set("topk(k=8,window=1)", view, i);
  }
  CHECK(mismatches == 0);
  CHECK(rows_identical(run_estimator("quest(page=1,budget=9,min_pages=1)", view), run_estimator("topk(k=9)", view),
                       view.n()));
}

TEST_CASE("quest and sparq score their rows 32 at a time: any order, any row twice, the same kept keys",
          "[selection]") {
  // A row's page bounds (quest) or approximate logits (sparq) come from its block of 32 rows, scored together the
  // first time one is asked for, and are handed over once; asked again, the row is scored alone. 100 rows: blocks of
  // 32, 32, 32 and 4. The kept keys and sparq's completion (its α from the approximate logits) must not depend on it.
  const HeadView view = masked_slice(100, 12, Mask::kCausal, 40, 5);
  for (const std::string spec : {"quest(page=8,budget=30)", "quest(page=3,budget=11,last=1)",
                                 "sparq(r=3,k=20,window=4)", "sparq(r=12,k=9,window=0)", "sparq(r=5,k=30,window=30)"}) {
    INFO(spec);
    const auto estimator = parse_spec(spec).make();
    const EstimateContext ctx{make_random_key(1, spec, 0)};
    const auto rows = estimator->kept_keys(view, ctx);
    int64_t mismatches = 0, completions = 0;
    for (int64_t r = 0; r < view.n(); ++r) {
      const int64_t i = view.n() - 1 - r;  // the last block first, its last row first
      const KeptKeys once = rows(i), again = rows(i), fresh = estimator->kept_keys(view, ctx)(i);
      for (const KeptKeys* other : {&again, &fresh}) {
        mismatches += (once.keys != other->keys) + (once.completions.size() != other->completions.size());
        for (size_t c = 0; c < std::min(once.completions.size(), other->completions.size()); ++c)
          mismatches += once.completions[c].log_mass != other->completions[c].log_mass;
      }
      completions += static_cast<int64_t>(once.completions.size());
      if (spec.rfind("quest", 0) == 0) mismatches += once.keys != stated_set(spec, view, i);
    }
    CHECK(mismatches == 0);
    // sparq: one completion (the value mean) on each row that does not keep every key it sees (row i sees i + 1 keys:
    // the rows seeing more than k)
    const std::map<std::string, int64_t> rows_with_completion = {
        {"sparq(r=3,k=20,window=4)", 80}, {"sparq(r=12,k=9,window=0)", 91}, {"sparq(r=5,k=30,window=30)", 70}};
    CHECK(completions == (rows_with_completion.count(spec) ? rows_with_completion.at(spec) : 0));
  }
}

TEST_CASE("quest rounding the page count down is not exact when the page does not divide the keys", "[selection]") {
  // Row 99 sees 100 keys in 7 pages of 16 (the last holds 4): floor keeps 6 pages, ceil all 7.
  const HeadView view = masked_slice(100, 8, Mask::kCausal, 0, 2);
  // Floor keeps 6 whole pages (96 keys, or 84 when the short last page is among them), never the 7th.
  std::set<int64_t> pages;
  for (int64_t key : stated_set("quest(page=16,budget=100,round=floor)", view, 99)) pages.insert(key / 16);
  CHECK(pages.size() == 6);
  CHECK(stated_set("quest(page=16,budget=100,round=ceil)", view, 99).size() == 100);
}

TEST_CASE("topk with k = 0 is streaming, bit for bit", "[selection]") {
  for (const Mask mask : {Mask::kCausal, Mask::kWindow}) {
    const HeadView view = masked_slice(300, 16, mask, 77, 3);
    CHECK(rows_identical(run_estimator("topk(k=0,sink=4,window=32)", view),
                         run_estimator("streaming(sink=4,window=32)", view), view.n()));
  }
}

TEST_CASE("a selection's error is its tail: (1 - m)(mu_T - mu_S), and its total variation is 1 - m", "[selection]") {
  for (const std::string& spec : {std::string("topk(k=6)"), std::string("topk(k=3,sink=2,window=5)"),
                                  std::string("topp(p=0.7)"), std::string("streaming(sink=2,window=9)"),
                                  std::string("quest(page=8,budget=24)"), std::string("moba(block=8)")}) {
    const HeadView view = masked_slice(120, 8, Mask::kCausal, 0, 21);
    const auto estimator = make_estimator(parse_spec(spec), Device::kCpu);
    const MatrixD estimate_weights = estimator->weights(view, {make_random_key(1, spec, 0)})(0, view.n());
    const MatrixD exact_weights = attention_rows_f64(view.q, view.k, view.scale, 0, view.n(), view.geometry());
    double worst_gap = 0, worst_tv = 0;
    for (int64_t i = 0; i < view.n(); ++i) {
      double m = 0;
      RowVectorD kept_sum = RowVectorD::Zero(view.pv()), tail_sum = RowVectorD::Zero(view.pv());
      for (int64_t j = 0; j < view.k.rows(); ++j) {
        const double a = exact_weights(i, j);
        if (estimate_weights(i, j) != 0) {
          m += a;
          kept_sum += a * view.v.row(j);
        } else {
          tail_sum += a * view.v.row(j);
        }
      }
      const RowVectorD o = exact_weights.row(i) * view.v, o_hat = estimate_weights.row(i) * view.v;
      const RowVectorD mu_s = kept_sum / m;
      const RowVectorD mu_t = m < 1 ? RowVectorD(tail_sum / (1 - m)) : RowVectorD::Zero(view.pv());
      const double predicted = (1 - m) * (mu_t - mu_s).norm();
      worst_gap = std::max(worst_gap, std::abs((o - o_hat).norm() - predicted) / o.norm());
      const double tv = 0.5 * (exact_weights.row(i) - estimate_weights.row(i)).cwiseAbs().sum();
      worst_tv = std::max(worst_tv, std::abs(tv - (1 - m)));
    }
    INFO(spec << ": tail identity " << worst_gap << ", total variation " << worst_tv);
    CHECK(worst_gap < 1e-12);  // observed ≤ 8.3e-16
    CHECK(worst_tv < 1e-12);   // observed ≤ 3.4e-16
  }
}

TEST_CASE("selection ties keep the older key", "[selection]") {
  // Keys 10, 20 and 30 are the same vector, longer than every other key by 10×: for row 40's query, along it,
  // they tie for the largest score (|k·u| ≤ |k| < their length for every other key).
  HeadView view = masked_slice(41, 8, Mask::kCausal, 0, 4);
  const double longest = view.k.rowwise().norm().maxCoeff();
  const RowVectorD along = 10 * longest * view.k.row(10).normalized();
  for (const int64_t j : {10, 20, 30}) view.k.row(j) = along;
  view.q.row(40) = along.normalized();
  view = with_data(view, view.q, view.k, view.v);
  CHECK(stated_set("topk(k=1)", view, 40) == std::vector<int64_t>{10});
  CHECK(stated_set("topk(k=2)", view, 40) == std::vector<int64_t>{10, 20});
  CHECK(stated_set("topk(k=1,window=12)", view, 40) ==
        std::vector<int64_t>{10, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40});
}

TEST_CASE("best_by_score keeps the set a full sort by score then older key keeps", "[selection]") {
  // best_by_score deals the scores into buckets and orders only the bucket the cut falls in; the definition is the
  // first `count` of the candidates sorted by (score descending, index ascending). Scores drawn from a few values
  // (ties everywhere, in the cut's bucket too), spread over 30 orders of magnitude (most in one bucket), ±0, an
  // infinity (the nth_element path), all equal, and candidates out of order with a gap in the indices.
  std::mt19937_64 draw(7);
  std::uniform_int_distribution<int> level(0, 5);
  std::normal_distribution<double> normal;
  const int64_t first = 3, keys = 3000;
  std::vector<std::vector<double>> settings(7, std::vector<double>(keys));
  for (int64_t j = 0; j < keys; ++j) {
    settings[0][j] = normal(draw);
    settings[1][j] = 0.25 * level(draw);
    settings[2][j] = std::pow(10.0, 30 * normal(draw) / 3) * (j % 2 ? 1 : -1);
    settings[3][j] = j % 3 == 0 ? 0.0 : j % 3 == 1 ? -0.0 : 1e-300;
    settings[4][j] = j == 17 ? INFINITY : normal(draw);
    settings[5][j] = 1.5;
    settings[6][j] = j < 100 ? 1e300 + 1e284 * normal(draw) : normal(draw);  // the rest in the lowest bucket
  }
  std::vector<int64_t> candidates;
  for (int64_t j = keys - 1; j >= 0; --j)
    if (j % 7 != 3) candidates.push_back(first + j);
  for (size_t s = 0; s < settings.size(); ++s)
    for (const int64_t count : {int64_t{1}, int64_t{2}, int64_t{150}, int64_t{1000}, int64_t{2570}}) {
      INFO("setting " << s << ", count " << count);
      const std::vector<double>& scores = settings[s];
      std::vector<int64_t> sorted = candidates;
      std::stable_sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) {
        const double sa = scores[a - first], sb = scores[b - first];
        return sa > sb || (sa == sb && a < b);
      });
      sorted.resize(count);
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> best = best_by_score(candidates, scores, first, count);
      std::sort(best.begin(), best.end());
      CHECK(best == sorted);
    }
}

TEST_CASE("positional selections have no full form", "[selection]") {
  CHECK_THROWS_AS(require_mask_support(parse_spec("streaming"), Mask::kFull), UsageError);
  CHECK_THROWS_AS(require_mask_support(parse_spec("topk(sink=4)"), Mask::kFull), UsageError);
  CHECK_NOTHROW(require_mask_support(parse_spec("topk"), Mask::kFull));
  CHECK_NOTHROW(require_mask_support(parse_spec("topk(sink=4)"), Mask::kCausal));
}

TEST_CASE("selection metrics: the kept keys' counts and mass, and a tail that predicts the error", "[selection]") {
  const std::vector<Metric> all = selection_metrics();
  for (const std::string& spec :
       {std::string("topk(k=6)"), std::string("topp(p=0.7)"), std::string("streaming(sink=2,window=9)"),
        std::string("topk(k=500)"), std::string("quest(page=8,budget=24)"), std::string("moba(block=8)")}) {
    for (const bool decode : {false, true}) {
      const HeadView whole = masked_slice(130, 8, Mask::kCausal, 0, 31);
      const HeadView view = decode ? last_rows(whole, 5) : whole;
      const auto estimator = make_estimator(parse_spec(spec), Device::kCpu);
      const EstimateContext ctx{make_random_key(1, spec, 0), nullptr};
      const std::vector<double> got = selection_metrics(view, estimator->kept_keys(view, ctx), all);
      // topk_recall@K at other K (--recall-k): 1 key, 32 keys (more than some rows see), 200 (more than any row).
      std::map<int64_t, double> got_recall;
      for (const int64_t k : {1, 32, 200})
        got_recall[k] = selection_metrics(view, estimator->kept_keys(view, ctx), {Metric::kTopkRecallAtK}, 0.05, k)[0];
      std::map<int64_t, double> recall_at;
      // From the definitions, with the kept sets the estimator states (checked against this file's own above).
      const MatrixD a = attention_rows_f64(view.q, view.k, view.scale, 0, view.n(), view.geometry());
      const MatrixD o_hat = attend_kept_f64(view, estimator->kept_keys(view, ctx));
      double attended = 0, density = 0, mass = 0, error = 0, kl = 0, overlap = 0, contained = 0, recall = 0;
      for (int64_t i = 0; i < view.n(); ++i) {
        const std::vector<int64_t> kept = stated_set(spec, view, i);
        const double visible = static_cast<double>(seen_keys(view, i).size());
        // The visible keys by exact weight (descending, the older first on ties): the oracle's sets.
        std::vector<int64_t> by_weight = seen_keys(view, i);
        std::stable_sort(by_weight.begin(), by_weight.end(), [&](int64_t x, int64_t y) { return a(i, x) > a(i, y); });
        auto count_in = [&](size_t size) {
          int64_t found = 0;
          for (size_t r = 0; r < std::min(size, by_weight.size()); ++r)
            found += std::binary_search(kept.begin(), kept.end(), by_weight[r]);
          return static_cast<double>(found);
        };
        const double same = count_in(kept.size());
        overlap += same / (2.0 * static_cast<double>(kept.size()) - same);
        contained += same / static_cast<double>(kept.size());
        recall += count_in(10) / std::min(10.0, visible);
        for (const int64_t k : {1, 32, 200})
          recall_at[k] += count_in(static_cast<size_t>(k)) / std::min(static_cast<double>(k), visible);
        double m = 0;
        for (int64_t j : kept) m += a(i, j);
        attended += static_cast<double>(kept.size());
        density += static_cast<double>(kept.size()) / visible;
        mass += m;
        kl += -std::log(m);
        error += (a.row(i) * view.v - o_hat.row(i)).norm();
      }
      const double rows = static_cast<double>(view.n());
      INFO(spec << (decode ? ", the last 5 rows" : ""));
      CHECK(got[0] == attended / rows);                                   // keys_attended
      CHECK(got[2] == Approx(density / rows).epsilon(1e-14));             // density
      CHECK(got[4] == Approx(mass / rows).epsilon(1e-12));                // mass_recall
      CHECK(got[5] == Approx(1 - mass / rows).margin(1e-12));             // tail_mass
      CHECK(got[7] == Approx(error / rows).epsilon(1e-9).margin(1e-15));  // tail_pred = mean ‖o_t − ô_t‖
      CHECK(got[8] == Approx(kl / rows).epsilon(1e-9).margin(1e-15));     // row_kl_rev
      CHECK(got[9] == Approx(overlap / rows).epsilon(1e-14));             // kept_overlap
      CHECK(got[10] == Approx(recall / rows).epsilon(1e-14));             // topk_recall@10
      CHECK(got.back() == Approx(contained / rows).epsilon(1e-14));       // kept_overlap_a, the last
      for (const int64_t k : {1, 32, 200}) {
        INFO("topk_recall@" << k);
        CHECK(got_recall[k] == Approx(recall_at[k] / rows).epsilon(1e-14));
      }
      if (spec == "topk(k=6)") CHECK((got[9] == 1.0 && got.back() == 1.0));  // the oracle of its own size
      // keys_scored: the oracles score every visible key, quest two bounds a page, moba a mean a past block.
      double scored = 0;
      for (int64_t i = 0; i < view.n(); ++i) {
        const double visible = static_cast<double>(seen_keys(view, i).size()), t = view.position(i);
        scored += spec.rfind("top", 0) == 0     ? visible
                  : spec.rfind("quest", 0) == 0 ? 2 * std::ceil((t + 1) / 8)
                  : spec.rfind("moba", 0) == 0  ? std::floor(t / 8)
                                                : 0.0;
      }
      CHECK(got[1] == Approx(scored / rows).epsilon(1e-14));
    }
  }
}

TEST_CASE("sweep --metrics selection writes the selection rows and refuses estimators without kept keys",
          "[selection][cli]") {
  const std::string dump = write_synth("selection.h5", synth_options(1, 1, 1, 64, 16));
  const std::string csv = temp_path("selection.csv");
  const auto ok = run_attnprobe("sweep " + dump + " -e \"topk(k=8)\" --mask causal --queries last:4 " +
                                "--metrics fro_rel,selection --overwrite -q -o " + csv);
  CHECK(ok.exit_code == 0);
  // One deterministic trial of one slice: one row per metric.
  const auto rows = run_shell("grep -c -E ',(keys_attended|mass_recall|tail_pred),' " + csv);
  CHECK(trim(rows.output) == "3");
  const auto refused = run_attnprobe("sweep " + dump + " -e softmax --metrics selection --overwrite -q -o " +
                                     temp_path("selection-refused.csv"));
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("states no kept set"));
}

namespace {

// SnapKV's kept set of decode row i (the rows before the view are its prompt), from the definition: votes of the
// last `window` prompt rows with their causal weights, zero-padded pooling, the best by (score, older key).
std::vector<int64_t> snapkv_set(const HeadView& view, int64_t i, int64_t window, int64_t budget, int64_t kernel,
                                bool max_pool) {
  const int64_t P = view.first_position, t = view.position(i);
  std::vector<int64_t> kept;
  if (P <= budget) {
    for (int64_t j = 0; j < P; ++j) kept.push_back(j);
  } else {
    const int64_t candidates = P - window, half = kernel / 2;
    std::vector<double> votes(candidates, 0.0);
    for (int64_t r = candidates; r < P; ++r) {
      std::vector<double> w(r + 1);
      double top = -INFINITY, total = 0;
      for (int64_t j = 0; j <= r; ++j)
        top =
            std::max(top, w[j] = view.scale * view.prompt_qf.row(r).cast<double>().dot(view.kf.row(j).cast<double>()));
      for (double& x : w) total += x = std::exp(x - top);
      for (int64_t j = 0; j < candidates; ++j) votes[j] += w[j] / total;
    }
    std::vector<double> padded(candidates + 2 * half, max_pool ? -INFINITY : 0.0), score(candidates);
    std::copy(votes.begin(), votes.end(), padded.begin() + half);
    for (int64_t j = 0; j < candidates; ++j) {
      double pooled = max_pool ? -INFINITY : 0.0;
      for (int64_t d = 0; d < kernel; ++d) pooled = max_pool ? std::max(pooled, padded[j + d]) : pooled + padded[j + d];
      score[j] = max_pool ? pooled : pooled / static_cast<double>(kernel);
    }
    std::vector<int64_t> order(candidates);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    order.resize(budget - window);
    kept = order;
    for (int64_t j = candidates; j < P; ++j) kept.push_back(j);
  }
  for (int64_t j = P; j <= t; ++j) kept.push_back(j);
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace

TEST_CASE("snapkv keeps the prompt keys its pooled votes choose, and the decode keys", "[selection][snapkv]") {
  const HeadView whole = masked_slice(240, 12, Mask::kCausal, 0, 31);
  struct Case {
    std::string spec;
    int64_t window, budget, kernel;
    bool max_pool;
    int64_t rows;
  };
  for (const Case& c : {Case{"snapkv(window=8,budget=40)", 8, 40, 5, false, 16},
                        Case{"snapkv(window=8,budget=32,kernel=7,pool=max)", 8, 32, 7, true, 5},
                        Case{"snapkv(window=12,budget=12,kernel=1)", 12, 12, 1, false, 30},
                        Case{"snapkv(window=4,budget=300)", 4, 300, 5, false, 16}}) {
    INFO(c.spec << ", the last " << c.rows << " rows");
    const HeadView view = last_rows(whole, c.rows);
    REQUIRE(view.prompt_qf.rows() == 240 - c.rows);
    const MatrixF out = run_estimator(c.spec, view);
    int64_t set_mismatches = 0;
    double worst = 0;
    for (int64_t i = 0; i < view.n(); ++i) {
      const std::vector<int64_t> kept = snapkv_set(view, i, c.window, c.budget, c.kernel, c.max_pool);
      set_mismatches += stated_set(c.spec, view, i) != kept;
      const RowVectorD expected = attend(view, i, kept);
      worst = std::max(worst, (out.row(i).cast<double>() - expected).norm() / expected.norm());
    }
    CHECK(set_mismatches == 0);
    CHECK(worst < 1e-5);  // float32 attention of the same keys: observed 1.7e-7..4.9e-7 per row
  }
  // A budget covering the prompt keeps every key: exact attention of the decode rows.
  const HeadView view = last_rows(whole, 16);
  const MatrixF out = run_estimator("snapkv(window=4,budget=300)", view);
  const MatrixD exact = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry());
  CHECK((out.cast<double>() - exact).norm() / exact.norm() < 1e-6);  // observed 3.3e-7: float32 rounding
}

TEST_CASE("snapkv pools its votes with zero padding counted (avg) and the in-range maximum (max)",
          "[selection][snapkv]") {
  const std::vector<double> votes = {1, 2, 3, 4, 5};
  // avg, kernel 3: the borders divide by 3 with one padded zero: (0 + 1 + 2)/3 = 1 and (4 + 5 + 0)/3 = 3.
  CHECK(pool_votes(votes, 3, SnapkvPool::kAvg) == std::vector<double>{1, 2, 3, 4, 3});
  CHECK(pool_votes(votes, 3, SnapkvPool::kMax) == std::vector<double>{2, 3, 4, 5, 5});
  CHECK(pool_votes(votes, 1, SnapkvPool::kAvg) == votes);  // kernel 1: no pooling
  CHECK(pool_votes(votes, 1, SnapkvPool::kMax) == votes);
  CHECK(pool_votes({7}, 5, SnapkvPool::kAvg) == std::vector<double>{7.0 / 5});
}

TEST_CASE("snapkv rows do not see later tokens, and it refuses what it cannot measure", "[selection][snapkv]") {
  // Replacing the tokens from position 230 on leaves every earlier decode row bit for bit.
  const HeadView whole = masked_slice(240, 12, Mask::kCausal, 0, 33);
  const HeadView changed = with_tokens_replaced(whole, 230, 4);
  const MatrixF a = run_estimator("snapkv(window=8,budget=40)", last_rows(whole, 20));
  const MatrixF b = run_estimator("snapkv(window=8,budget=40)", last_rows(changed, 20));
  CHECK(rows_identical(a, b, 10));
  CHECK(!rows_identical(a.bottomRows(10), b.bottomRows(10), 10));
  // No prompt (a whole slice), a prompt no longer than the window: exit 3 from the estimator.
  CHECK_THROWS_AS(run_estimator("snapkv", whole), InputError);
  CHECK_THROWS_AS(run_estimator("snapkv(window=32)", last_rows(whole, 210)), InputError);
  CHECK_THROWS_AS(parse_spec("snapkv(kernel=4)"), UsageError);
  CHECK_THROWS_AS(parse_spec("snapkv(window=64,budget=32)"), UsageError);
  // On the command line: all rows is a usage error, decode rows run.
  const std::string dump = write_synth("snapkv.h5", synth_options(1, 1, 1, 96, 16));
  const auto all = run_attnprobe("eval " + dump + " -e snapkv --mask causal -q");
  CHECK(all.exit_code == 2);
  CHECK_THAT(all.output, Catch::Contains("--queries last:W"));
  const auto decode = run_attnprobe("eval " + dump +
                                    " -e 'snapkv(window=8,budget=24)' --mask causal --queries last:8 --metrics "
                                    "spec_rel,selection -q");
  INFO(decode.output);
  CHECK(decode.exit_code == 0);
  CHECK_THAT(decode.output, Catch::Contains("keys_attended"));
}

TEST_CASE("topk_recall@K: the name carries K, one K per sweep", "[selection][cli]") {
  CHECK(find_metric("topk_recall@32") == Metric::kTopkRecallAtK);
  CHECK(find_metric("topk_recall@10") == Metric::kTopkRecallAtK);
  for (const char* bad : {"topk_recall@", "topk_recall@0", "topk_recall@032", "topk_recall@3x", "topk_recall@-3"})
    CHECK_FALSE(find_metric(bad).has_value());
  CHECK(metric_name(Metric::kTopkRecallAtK, 32) == "topk_recall@32");
  CHECK(metric_name(Metric::kMassRecall, 32) == "mass_recall");
  int64_t k = 0;
  CHECK(parse_metrics("spec_rel,topk_recall@32", &k) == std::vector<Metric>{Metric::kSpecRel, Metric::kTopkRecallAtK});
  CHECK(k == 32);
  k = 16;
  CHECK_THROWS_WITH(parse_metrics("topk_recall@32", &k), Catch::Contains("one K per sweep"));
  k = 0;
  CHECK_THROWS_AS(parse_metrics("topk_recall@4,topk_recall@8", &k), UsageError);
  CHECK_THROWS_AS(parse_metrics("topk_recall@0"), UsageError);

  const std::string dump = write_synth("recall_k.h5", synth_options(1, 1, 1, 96, 16));
  const std::string base = "sweep " + dump + " -e 'topk(k=8)' --mask causal --queries last:8 --overwrite -q ";
  auto recall_rows = [](const std::string& csv) {
    std::map<std::string, std::string> values;  // metric name → value
    for (const std::string& line : split(read_text(csv), '\n'))
      if (line.find("topk_recall@") != std::string::npos) {
        const std::vector<std::string> fields = split(line, ',');
        values[fields[fields.size() - 2]] = fields.back();
      }
    return values;
  };
  const std::string by_option = temp_path("recall_k_option.csv"), by_name = temp_path("recall_k_name.csv");
  REQUIRE(run_attnprobe(base + "--metrics selection --recall-k 32 -o " + by_option).exit_code == 0);
  REQUIRE(run_attnprobe(base + "--metrics topk_recall@32 -o " + by_name).exit_code == 0);
  const auto from_option = recall_rows(by_option);
  REQUIRE(from_option.size() == 1);
  CHECK(from_option.count("topk_recall@32") == 1);
  CHECK(recall_rows(by_name) == from_option);  // the same value, named by --metrics alone
  // topk(k=8) holds the 8 heaviest keys of its 96-key rows: exactly 8 of the 32 heaviest.
  CHECK(std::stod(from_option.at("topk_recall@32")) == 0.25);
  CHECK(run_attnprobe(base + "--metrics topk_recall@32 --recall-k 16 -o " + temp_path("x.csv")).exit_code == 2);
  CHECK(run_attnprobe(base + "--metrics selection --recall-k -1 -o " + temp_path("x.csv")).exit_code == 2);
  // Resuming with another K is another grid.
  CHECK(run_attnprobe("sweep " + dump + " -e 'topk(k=8)' --mask causal --queries last:8 -q --metrics selection " +
                      "--recall-k 16 --resume -o " + by_option)
            .exit_code == 2);
}

TEST_CASE("kept_overlap against a selection reference: method against method", "[selection][cli]") {
  const HeadView view = last_rows(masked_slice(120, 8, Mask::kCausal, 0, 41), 6);
  const std::string method = "streaming(sink=2,window=14)", reference = "topk(k=24)";
  const auto kept_of = [&](const std::string& spec) {
    return make_estimator(parse_spec(spec), Device::kCpu)->kept_keys(view, {make_random_key(1, spec, 0)});
  };
  const Estimator::KeptRows against = kept_of(reference);
  const double got = selection_metrics(view, kept_of(method), {Metric::kKeptOverlap}, 0.05, 10, &against)[0];
  // Jaccard of the two stated sets and the share of the method's keys the reference keeps too (kept_overlap_a),
  // row by row, from the sets alone.
  double jaccard = 0, share = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    const std::vector<int64_t> s = stated_set(method, view, i), r = stated_set(reference, view, i);
    std::vector<int64_t> both;
    std::set_intersection(s.begin(), s.end(), r.begin(), r.end(), std::back_inserter(both));
    jaccard += static_cast<double>(both.size()) / static_cast<double>(s.size() + r.size() - both.size());
    share += static_cast<double>(both.size()) / static_cast<double>(s.size());
  }
  CHECK(got == Approx(jaccard / 6).epsilon(1e-15));  // observed 0.1117 (streaming keeps 16 keys, topk 24)
  CHECK(got < 1);
  const double self = selection_metrics(view, against, {Metric::kKeptOverlap}, 0.05, 10, &against)[0];
  CHECK(self == 1.0);
  const std::vector<double> pair =
      selection_metrics(view, kept_of(method), {Metric::kKeptOverlapA, Metric::kKeptOverlap}, 0.05, 10, &against);
  CHECK(pair[0] == Approx(share / 6).epsilon(1e-15));  // observed 0.25: about 4 of streaming's 16 keys
  CHECK(pair[1] == got);                               // asked together, the Jaccard is unchanged
  // Nested sets: topk(k=12) lies inside topk(k=24) on every row (one ranking, one tie rule), so its share is 1
  // exactly while the Jaccard is 12/24.
  const std::vector<double> nested =
      selection_metrics(view, kept_of("topk(k=12)"), {Metric::kKeptOverlapA, Metric::kKeptOverlap}, 0.05, 10, &against);
  CHECK(nested[0] == 1.0);
  CHECK(nested[1] == 0.5);

  // On the command line: --reference topk(k=24) gives that value; the default reference the oracle's (the 16
  // heaviest keys: another set than topk(k=24)'s, so another value).
  const std::string dump = write_synth("overlap_reference.h5", synth_options(1, 1, 1, 96, 16));
  const std::string base = "sweep " + dump + " -e '" + method + "' --mask causal --queries last:8 --overwrite -q " +
                           "--metrics kept_overlap ";
  const std::string by_topk = temp_path("overlap_topk.csv"), by_oracle = temp_path("overlap_oracle.csv");
  REQUIRE(run_attnprobe(base + "--reference '" + reference + "' -o " + by_topk).exit_code == 0);
  REQUIRE(run_attnprobe(base + "-o " + by_oracle).exit_code == 0);
  auto value = [](const std::string& csv) { return std::stod(split(trim(read_text(csv)), ',').back()); };
  HeadView whole = Dump::open(dump).read_slice(0, 0, 0, 96);
  whole.mask = Mask::kCausal;
  const HeadView cli_view = last_rows(whole, 8);
  const Estimator::KeptRows cli_against =
      make_estimator(parse_spec(reference), Device::kCpu)->kept_keys(cli_view, {make_random_key(1, reference, 0)});
  const Estimator::KeptRows cli_kept =
      make_estimator(parse_spec(method), Device::kCpu)->kept_keys(cli_view, {make_random_key(1, method, 0)});
  CHECK(
      value(by_topk) ==
      Approx(selection_metrics(cli_view, cli_kept, {Metric::kKeptOverlap}, 0.05, 10, &cli_against)[0]).epsilon(1e-15));
  CHECK(value(by_oracle) == Approx(selection_metrics(cli_view, cli_kept, {Metric::kKeptOverlap})[0]).epsilon(1e-15));
  CHECK(value(by_topk) != value(by_oracle));
}
