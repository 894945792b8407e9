#include "attnprobe/report/summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "attnprobe/common/error.h"

namespace attnprobe {

namespace {

SummaryRow describe(const CaseKey& key, const std::string& metric, std::vector<double> values) {
  SummaryRow s;
  s.key = key;
  s.metric = metric;
  s.count = static_cast<int64_t>(values.size());
  // Sums of values scaled by the power of two nearest the largest magnitude: finite values near 1e308
  // neither overflow the sum nor their squared deviations (a plain sum turns two of them into inf), and a
  // power of two scales without rounding, so every other summary keeps its bits.
  double largest = 0;
  for (double v : values)
    if (std::isfinite(v)) largest = std::max(largest, std::abs(v));
  const double scale = largest > 0 ? std::ldexp(1.0, std::ilogb(largest)) : 1.0;
  double sum = 0;
  for (double v : values) sum += v / scale;
  const double scaled_mean = sum / s.count;
  s.mean = scaled_mean * scale;
  double squares = 0;
  for (double v : values) squares += (v / scale - scaled_mean) * (v / scale - scaled_mean);
  // One value has no spread to estimate: NaN, not 0 (a deterministic case is not known to ±0; stderr_or_zero
  // is what the gate and --compare hold it to).
  s.std = s.count > 1 ? std::sqrt(squares / (s.count - 1)) * scale : std::nan("");
  s.stderr_ = s.std / std::sqrt(static_cast<double>(s.count));
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  s.median = values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
  s.min = values.front();
  s.max = values.back();
  if (std::any_of(values.begin(), values.end(), [](double v) { return std::isnan(v); }))
    s.median = s.min = s.max = s.mean = s.std = s.stderr_ = std::nan("");
  return s;
}

// Groups (key, metric) → values. Output keeps the order in which cases and metrics first appear
// (the order the sweep wrote them), so a summary reads like the sweep.
std::vector<SummaryRow> aggregate(const std::vector<std::pair<std::pair<CaseKey, std::string>, double>>& items) {
  std::map<std::pair<CaseKey, std::string>, size_t> index;
  std::vector<std::pair<CaseKey, std::string>> order;
  std::vector<std::vector<double>> values;
  for (const auto& [id, value] : items) {
    auto [it, inserted] = index.emplace(id, order.size());
    if (inserted) {
      order.push_back(id);
      values.emplace_back();
    }
    values[it->second].push_back(value);
  }
  std::vector<SummaryRow> out;
  out.reserve(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    out.push_back(describe(order[i].first, order[i].second, std::move(values[i])));
  return out;
}

}  // namespace

std::string case_label(const CaseKey& k, const std::string& metric) {
  return fmt::format("{} L{} H{} B{} n={} {} vs {}, {}", k.dump, k.layer.text(), k.head.text(), k.batch.text(),
                     k.n.text(), k.spec, k.reference, metric);
}

std::vector<SummaryRow> summarize_trials(const std::vector<TrialRow>& rows, const std::string& source) {
  std::vector<std::pair<std::pair<CaseKey, std::string>, double>> items;
  items.reserve(rows.size());
  // A trial counted twice would double its weight and shrink the standard error.
  std::set<TrialRowId> seen;
  for (const TrialRow& r : rows) {
    require_input(seen.insert(row_id(r)).second,
                  "{}trial {} (seed {}) of {} appears twice: were two runs written into one file? (`attnprobe merge` "
                  "joins shards; a rerun needs -o another file or --resume)",
                  source.empty() ? "" : source + ": ", r.trial, r.seed, case_label(r.key, r.metric));
    items.push_back({{r.key, r.metric}, r.value});
  }
  return aggregate(items);
}

std::vector<SummaryRow> summarize_over(const std::vector<SummaryRow>& per_case, const std::vector<std::string>& over) {
  for (const std::string& column : over)
    if (column != "layer" && column != "head" && column != "batch" && column != "n")
      throw UsageError(fmt::format("--over takes layer, head, batch and n; '{}' is none of them", column));
  auto has = [&](const char* c) { return std::find(over.begin(), over.end(), c) != over.end(); };
  std::vector<std::pair<std::pair<CaseKey, std::string>, double>> items;
  for (const SummaryRow& s : per_case) {
    CaseKey key = s.key;
    if (has("layer")) key.layer = Coordinate::all();
    if (has("head")) key.head = Coordinate::all();
    if (has("batch")) key.batch = Coordinate::all();
    if (has("n")) key.n = Coordinate::all();
    items.push_back({{key, s.metric}, s.mean});
  }
  return aggregate(items);
}

double stderr_or_zero(const SummaryRow& s) { return s.count == 1 ? 0.0 : s.stderr_; }

std::vector<SummaryRow> pool_over_slices(const std::vector<TrialRow>& rows) {
  return summarize_over(summarize_trials(rows), {"layer", "head", "batch", "n"});
}

}  // namespace attnprobe
