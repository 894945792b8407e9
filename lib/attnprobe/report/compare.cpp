#include "attnprobe/report/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/schema.h"
#include "attnprobe/report/spec_text.h"
#include "attnprobe/report/summary.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A slice of a head with both settings: A's and B's mean and their Monte-Carlo variances of the mean.
struct PairedSlice {
  double a = 0, b = 0, variance = 0;
};

// One head: its slices (batch items) in input order.
struct HeadPairs {
  std::vector<PairedSlice> slices;
  double a() const {
    return average([](const PairedSlice& s) { return s.a; });
  }
  double b() const {
    return average([](const PairedSlice& s) { return s.b; });
  }
  // The variance of the mean over the head's batch items of the per-slice differences (independent trials).
  double variance() const {
    double sum = 0;
    for (const PairedSlice& s : slices) sum += s.variance;
    return sum / static_cast<double>(slices.size() * slices.size());
  }
  template <class Get>
  double average(Get get) const {
    double sum = 0;
    for (const PairedSlice& s : slices) sum += get(s);
    return sum / static_cast<double>(slices.size());
  }
};

// The key of a slice without its setting: where A's and B's rows pair.
CaseKey slice_of(CaseKey key) {
  key.estimator.clear();
  key.spec.clear();
  key.samples.reset();
  return key;
}

// The key of an output row: a slice's key pooled over layer, head and batch.
CaseKey pooled(CaseKey key) {
  key.layer = key.head = key.batch = Coordinate::all();
  return key;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t m = values.size();
  return m % 2 ? values[m / 2] : 0.5 * (values[m / 2 - 1] + values[m / 2]);
}

// The 95% percentile interval of the mean of `values` over kBootstrapResamples resamples of them with replacement.
// The draws are Philox at (resample, index) under a fixed key, so the interval is the same on every run.
std::pair<double, double> bootstrap_interval(const std::vector<double>& values) {
  const RandomStream stream(RandomKey{0x636f6d7061726521ull}, Purpose::kGeneric);  // "compare!"
  const uint32_t m = static_cast<uint32_t>(values.size());
  std::vector<double> means(kBootstrapResamples);
  for (int r = 0; r < kBootstrapResamples; ++r) {
    double sum = 0;
    for (uint32_t i = 0; i < m; ++i) sum += values[stream.index(m, static_cast<uint32_t>(r), i)];
    means[r] = sum / m;
  }
  std::sort(means.begin(), means.end());
  // Order statistics 250 and 9750 (1-based) of 10000: the 2.5% and 97.5% points.
  return {means[kBootstrapResamples / 40 - 1], means[kBootstrapResamples - kBootstrapResamples / 40]};
}

std::string specs_present(const std::vector<SummaryRow>& per_case) {
  std::set<std::string> specs;
  for (const SummaryRow& s : per_case) specs.insert(s.key.spec);
  std::vector<std::string> listed(specs.begin(), specs.end());
  if (listed.size() > 12) {
    listed.resize(12);
    listed.push_back("…");
  }
  return join(listed, ", ");
}

}  // namespace

double sign_test_p(int64_t k, int64_t m) {
  if (m <= 0) return 1.0;
  const int64_t tail = std::min(k, m - k);
  // 2·P(X ≤ tail), summed in log space so that hundreds of heads do not underflow the binomial coefficients.
  double sum = 0;
  for (int64_t i = 0; i <= tail; ++i)
    sum += std::exp(std::lgamma(m + 1.0) - std::lgamma(i + 1.0) - std::lgamma(m - i + 1.0) - m * std::log(2.0));
  return std::min(1.0, 2.0 * sum);
}

std::vector<ComparisonRow> compare_paired(const std::vector<SummaryRow>& per_case, const std::string& typed_a,
                                          const std::string& typed_b) {
  const std::string a = written_spec(typed_a), b = written_spec(typed_b);
  if (a == b) throw UsageError(fmt::format("--compare {} {}: compare two different settings", a, b));
  std::map<std::pair<CaseKey, std::string>, const SummaryRow*> b_rows;
  bool any_a = false;
  for (const SummaryRow& s : per_case) {
    if (s.key.layer.is_all() || s.key.head.is_all() || s.key.batch.is_all())
      throw UsageError(
          "--compare pairs the settings slice by slice: give it trial CSVs or per-case summaries, not a summary "
          "pooled with --over");
    any_a = any_a || s.key.spec == a;
    if (s.key.spec == b) b_rows[{slice_of(s.key), s.metric}] = &s;
  }
  for (const auto& [spec, present] : {std::pair{a, any_a}, std::pair{b, !b_rows.empty()}})
    if (!present)
      throw UsageError(fmt::format(
          "--compare: no row has the spec '{}'. Give the canonical spec as the CSV writes it; the input has: {}", spec,
          specs_present(per_case)));

  // (pooled case, metric) → head (dump, layer, head) → its paired slices, in the order A's rows come.
  std::vector<std::pair<CaseKey, std::string>> order;
  std::map<std::pair<CaseKey, std::string>, std::map<std::tuple<std::string, Coordinate, Coordinate>, HeadPairs>>
      groups;
  for (const SummaryRow& s : per_case) {
    if (s.key.spec != a) continue;
    const auto other = b_rows.find({slice_of(s.key), s.metric});
    if (other == b_rows.end()) continue;
    const std::pair<CaseKey, std::string> group{slice_of(pooled(s.key)), s.metric};
    if (!groups.count(group)) order.push_back(group);
    const SummaryRow& t = *other->second;
    groups[group][{s.key.dump, s.key.layer, s.key.head}].slices.push_back(
        {s.mean, t.mean, std::pow(stderr_or_zero(s), 2) + std::pow(stderr_or_zero(t), 2)});
  }
  if (order.empty())
    throw UsageError(fmt::format(
        "--compare {} {}: no slice has both settings (same dump, layer, head, batch, n, mask, queries and reference)",
        a, b));

  std::vector<ComparisonRow> out;
  for (const auto& group : order) {
    const auto& heads = groups[group];
    const std::optional<Metric> metric = find_metric(group.second);
    const bool larger = metric && larger_is_better(*metric);
    ComparisonRow row{group.first, a, b, group.second};
    std::vector<double> diffs, ratios;
    double variance = 0;
    for (const auto& [head, pairs] : heads) {
      const double ha = pairs.a(), hb = pairs.b(), d = ha - hb;
      row.slices += static_cast<int64_t>(pairs.slices.size());
      row.mean_a += ha;
      row.mean_b += hb;
      diffs.push_back(d);
      ratios.push_back(hb != 0 ? ha / hb : kNaN);
      variance += pairs.variance();
      if (d == 0)
        ++row.ties;
      else if ((d < 0) != larger)
        ++row.a_better;
      else
        ++row.b_better;
    }
    const double h = static_cast<double>(heads.size());
    row.heads = static_cast<int64_t>(heads.size());
    row.mean_a /= h;
    row.mean_b /= h;
    double sum = 0;
    for (double d : diffs) sum += d;
    row.diff = sum / h;
    double squares = 0;
    for (double d : diffs) squares += (d - row.diff) * (d - row.diff);
    row.head_sd = heads.size() > 1 ? std::sqrt(squares / (h - 1)) : 0.0;
    row.mc_stderr = std::sqrt(variance) / h;
    std::tie(row.ci_low, row.ci_high) = bootstrap_interval(diffs);
    const int64_t decided = row.a_better + row.b_better;
    row.sign_p = decided ? sign_test_p(row.a_better, decided) : kNaN;
    const bool finite_ratios = std::none_of(ratios.begin(), ratios.end(), [](double r) { return std::isnan(r); });
    row.median_ratio = finite_ratios ? median(ratios) : kNaN;
    out.push_back(std::move(row));
  }
  return out;
}

std::string comparison_csv_text(const std::vector<ComparisonRow>& rows) {
  std::vector<Column<ComparisonRow>> columns =
      lifted_key_columns<ComparisonRow>({"layer", "head", "batch", "estimator", "spec", "samples"});
  auto add = [&](std::string name, std::function<std::string(const ComparisonRow&)> get) {
    columns.push_back({std::move(name), std::move(get), nullptr});
  };
  auto real = [&](std::string name, double ComparisonRow::*field) {
    add(std::move(name), [field](const ComparisonRow& r) { return format_real(r.*field); });
  };
  auto count = [&](std::string name, int64_t ComparisonRow::*field) {
    add(std::move(name), [field](const ComparisonRow& r) { return std::to_string(r.*field); });
  };
  add("metric", [](const ComparisonRow& r) { return r.metric; });
  add("a", [](const ComparisonRow& r) { return r.a; });
  add("b", [](const ComparisonRow& r) { return r.b; });
  count("heads", &ComparisonRow::heads);
  count("slices", &ComparisonRow::slices);
  real("mean_a", &ComparisonRow::mean_a);
  real("mean_b", &ComparisonRow::mean_b);
  real("diff", &ComparisonRow::diff);
  real("ci_low", &ComparisonRow::ci_low);
  real("ci_high", &ComparisonRow::ci_high);
  count("a_better", &ComparisonRow::a_better);
  count("b_better", &ComparisonRow::b_better);
  count("ties", &ComparisonRow::ties);
  real("sign_p", &ComparisonRow::sign_p);
  real("median_ratio", &ComparisonRow::median_ratio);
  real("mc_stderr", &ComparisonRow::mc_stderr);
  real("head_sd", &ComparisonRow::head_sd);
  return csv_text(columns, rows);
}

}  // namespace attnprobe
