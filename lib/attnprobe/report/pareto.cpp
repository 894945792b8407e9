#include "attnprobe/report/pareto.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/schema.h"

namespace attnprobe {

std::vector<ParetoRow> pareto_fronts(const std::vector<SummaryRow>& per_case, const std::string& axis) {
  // The axis of every setting, then its other metrics grouped by (case but spec and samples, metric).
  std::map<CaseKey, double> cost;
  for (const SummaryRow& s : per_case)
    if (s.metric == axis && !std::isnan(s.mean)) cost[s.key] = s.mean;
  if (cost.empty())
    throw UsageError(
        fmt::format("--pareto {}: no case has the metric '{}'; sweep selection estimators with --metrics selection (or "
                    "name it) to get it",
                    axis, axis));
  std::map<std::pair<CaseKey, std::string>, std::vector<ParetoRow>> groups;
  for (const SummaryRow& s : per_case) {
    const auto found = cost.find(s.key);
    if (s.metric == axis || found == cost.end() || std::isnan(s.mean)) continue;
    CaseKey setting = s.key;
    setting.spec.clear();
    setting.samples.reset();
    groups[{setting, s.metric}].push_back(ParetoRow{s.key, s.metric, found->second, s.mean});
  }
  std::vector<ParetoRow> fronts;
  for (auto& [group, points] : groups) {
    const std::optional<Metric> metric = find_metric(group.second);
    const bool larger = metric && larger_is_better(*metric);
    auto better = [larger](double a, double b) { return larger ? a > b : a < b; };
    // Axis ascending, the better value first among equal axes; then keep the strict improvements.
    std::sort(points.begin(), points.end(), [&](const ParetoRow& a, const ParetoRow& b) {
      if (a.axis != b.axis) return a.axis < b.axis;
      if (a.value != b.value) return better(a.value, b.value);
      return a.key.spec < b.key.spec;
    });
    bool any = false;
    double best = 0;
    for (const ParetoRow& point : points)
      if (!any || better(point.value, best)) {
        fronts.push_back(point);
        best = point.value;
        any = true;
      }
  }
  return fronts;
}

std::string pareto_csv_text(const std::vector<ParetoRow>& rows, const std::string& axis) {
  std::vector<Column<ParetoRow>> columns = lifted_key_columns<ParetoRow>();
  auto add = [&](std::string name, std::function<std::string(const ParetoRow&)> get) {
    columns.push_back({std::move(name), std::move(get), nullptr});
  };
  add("metric", [](const ParetoRow& r) { return r.metric; });
  add(axis, [](const ParetoRow& r) { return format_real(r.axis); });
  add("value", [](const ParetoRow& r) { return format_real(r.value); });
  return csv_text(columns, rows);
}

}  // namespace attnprobe
