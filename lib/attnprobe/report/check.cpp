#include "attnprobe/report/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/records/schema.h"
#include "attnprobe/report/summary.h"

namespace attnprobe {

namespace {

// The gate squares standard errors and adds slack to means: a statistic must be finite and small enough
// that its square is too, or the allowed increase overflows to inf and every run passes.
constexpr double kLargestGatedValue = 1e150;
// A standard error a million times its mean says the trials disagree wholesale or the file was edited: no
// change of the mean could exceed z·se, so the row would pass whatever the run did.
constexpr double kLargestRelativeStderr = 1e6;

// NaN passes here: a NaN mean in the new run is a regression (check_regressions), in the baseline refused below.
void require_gated_value(const std::string& where, const char* role, const char* column, double value) {
  require_input(std::isnan(value) || (std::isfinite(value) && std::abs(value) < kLargestGatedValue),
                "{} ({}): the {} is {}; the gate holds only finite statistics below {:g} (their squares must be "
                "finite), or any run would pass. The file is damaged, or the run overflowed: rerun it.",
                where, role, column, format_real(value), kLargestGatedValue);
}

std::string row_place(const CsvContents& contents, size_t i, const std::string& source) {
  return i < contents.row_places.size() ? contents.row_places[i] : "'" + source + "'";
}

}  // namespace

std::vector<SummaryRow> gate_input(const CsvContents& contents, const std::string& source, bool baseline) {
  const char* role = baseline ? "baseline" : "new run";
  std::vector<SummaryRow> summaries;
  if (contents.summary) {
    summaries = contents.summaries;
    for (size_t i = 0; i < summaries.size(); ++i) {
      const SummaryRow& s = summaries[i];
      const std::string where = row_place(contents, i, source);
      for (const auto& [column, value] :
           {std::pair{"mean", s.mean}, std::pair{"std", s.std}, std::pair{"stderr", s.stderr_},
            std::pair{"median", s.median}, std::pair{"min", s.min}, std::pair{"max", s.max}})
        require_gated_value(where, role, column, value);
    }
  } else {
    for (size_t i = 0; i < contents.trials.size(); ++i) {
      const TrialRow& r = contents.trials[i];
      require_gated_value(row_place(contents, i, source), role, "value", r.value);
      const std::string what = case_label(r.key, r.metric);
      const std::optional<Metric> metric = find_metric(r.metric);
      require_input(metric.has_value(), "'{}' ({}): unknown metric '{}' in {}.", source, role, r.metric, what);
      // A case-level metric's row is trial −1 (kCaseTrial); every other row is a trial ≥ 0.
      const bool case_row = is_case_metric(*metric);
      require_input(case_row ? r.trial == kCaseTrial : r.trial >= 0, "'{}' ({}): trial {} of {} is not {}.", source,
                    role, r.trial, what, case_row ? "-1, the trial of a case-level metric" : "a trial number >= 0");
      require_possible_values(fmt::format("'{}' ({}): {}", source, role, what), r);
    }
    summaries = summarize_trials(contents.trials, fmt::format("'{}' ({})", source, role));  // refuses a trial twice
  }
  require_input(!summaries.empty(),
                "'{}' ({}) has a header but no rows: an empty {} would let every run pass. Did the run fail?", source,
                role, role);
  std::set<std::pair<CaseKey, std::string>> seen;
  for (const SummaryRow& s : summaries) {
    const std::string what = case_label(s.key, s.metric);
    require_input(find_metric(s.metric).has_value(), "'{}' ({}): unknown metric '{}' in {}.", source, role, s.metric,
                  what);
    require_input(seen.emplace(s.key, s.metric).second, "'{}' ({}): {} appears twice.", source, role, what);
    require_input(s.count >= 1, "'{}' ({}): {} has count {}; a summary row needs at least one trial.", source, role,
                  what, s.count);
    require_possible_values(fmt::format("'{}' ({}): {}", source, role, what), s);
    // A single value's spread is NaN (none exists; older files wrote 0): held to zero (stderr_or_zero).
    const bool single =
        s.count == 1 && ((std::isnan(s.std) && std::isnan(s.stderr_)) || (s.std == 0 && s.stderr_ == 0));
    require_input(std::isnan(s.mean) || single || (s.std >= 0 && s.stderr_ >= 0),
                  "'{}' ({}): {} has std {} and stderr {}; both must be >= 0 (NaN only for a single value).", source,
                  role, what, format_real(s.std), format_real(s.stderr_));
    require_input(std::isnan(s.mean) || single || s.stderr_ <= kLargestRelativeStderr * std::abs(s.mean),
                  "'{}' ({}): {} has the mean {} ± {}, a standard error over {:g} times its mean: no change of the "
                  "mean could fail the gate. The file is damaged or its trials are not comparable.",
                  source, role, what, format_real(s.mean), format_real(s.stderr_), kLargestRelativeStderr);
    // A selection metric is NaN by definition where it does not apply (den_rel of a deterministic selection, tail_mass
    // of a sampler, pilot without a pilot: docs/metrics.md), so a sound selection sweep holds such NaNs; the gate
    // then holds that case to nothing, and a number becoming NaN later is still a regression. Every other NaN or
    // infinity in a baseline is a broken run.
    const bool not_applicable = std::isnan(s.mean) && is_selection_metric(*find_metric(s.metric));
    if (baseline && !not_applicable)
      require_input(std::isfinite(s.mean) && std::isfinite(stderr_or_zero(s)),
                    "'{}' (baseline): {} has the mean {} ± {}, which no run can be held to. Refresh the baseline "
                    "from a sound run.",
                    source, what, format_real(s.mean), format_real(s.stderr_));
  }
  return summaries;
}

std::vector<SummaryRow> load_gate_input(const std::string& path, bool baseline) {
  const CsvContents c = read_csv(path);
  require_input(!c.truncated_tail,
                "'{}' ends in a line without its newline (an interrupted write?); the gate does not guess whether "
                "that row is whole. Finish the run (--resume), or add the newline if the file is complete.",
                path);
  return gate_input(c, path, baseline);
}

void validate_check_options(const CheckOptions& options) {
  // With statistics < 1e150 (gate_input), slack up to 1e6 keeps z·se + atol + rtol·|mean| finite.
  constexpr double kLargestOption = 1e6;
  for (auto [name, value] : {std::pair{"--z", options.z}, {"--atol", options.atol}, {"--rtol", options.rtol}})
    require_usage(std::isfinite(value) && value >= 0 && value <= kLargestOption,
                  "{} must be a number from 0 to {:g} (got {}); a larger slack lets every run pass", name,
                  kLargestOption, format_real(value));
  std::vector<std::string> names;
  for (Metric m : known_metrics()) names.push_back(metric_name(m));
  for (const std::string& m : options.metrics)
    require_usage(find_metric(m).has_value(), "--metrics: unknown metric '{}'; use a list of {}", m, join(names, ","));
}

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kRegression:
      return "regression";
    case Verdict::kImprovement:
      return "improvement";
    case Verdict::kMissing:
      return "missing";
    case Verdict::kNew:
      return "new";
  }
  return "?";
}

CheckReport check_regressions(const std::vector<SummaryRow>& baseline, const std::vector<SummaryRow>& current,
                              const CheckOptions& options) {
  auto gated = [&](const std::string& metric) {
    return options.metrics.empty() ||
           std::find(options.metrics.begin(), options.metrics.end(), metric) != options.metrics.end();
  };
  std::map<std::pair<CaseKey, std::string>, const SummaryRow*> fresh;
  for (const SummaryRow& s : current) fresh[{s.key, s.metric}] = &s;
  std::map<std::pair<CaseKey, std::string>, bool> seen;

  CheckReport report;
  for (const SummaryRow& base : baseline) {
    if (!gated(base.metric)) continue;
    Comparison c;
    c.key = base.key;
    c.metric = base.metric;
    c.base_mean = base.mean;
    c.base_se = stderr_or_zero(base);
    seen[{base.key, base.metric}] = true;
    auto it = fresh.find({base.key, base.metric});
    if (it == fresh.end()) {
      c.verdict = Verdict::kMissing;
      c.z = std::numeric_limits<double>::infinity();
      ++report.missing;
      report.comparisons.push_back(c);
      continue;
    }
    ++report.compared;
    c.new_mean = it->second->mean;
    c.new_se = stderr_or_zero(*it->second);
    const double se = std::hypot(c.base_se, c.new_se);  // inputs are < 1e150 (gate_input): cannot overflow
    // How much worse the new run is: larger is worse for every metric but topk_recall.
    const std::optional<Metric> metric = find_metric(base.metric);
    const double diff = metric && larger_is_better(*metric) ? c.base_mean - c.new_mean : c.new_mean - c.base_mean;
    c.threshold = options.z * se + options.atol + options.rtol * std::abs(c.base_mean);
    c.z = se > 0 ? diff / se : diff == 0 ? 0 : std::copysign(std::numeric_limits<double>::infinity(), diff);
    if (std::isnan(c.new_mean) && !std::isnan(c.base_mean)) {
      c.verdict = Verdict::kRegression;  // a number became NaN
      c.z = std::numeric_limits<double>::infinity();
    } else if (std::isnan(c.new_mean) || std::isnan(c.base_mean)) {
      c.verdict = Verdict::kOk;  // NaN in the baseline: nothing to hold the new run to
    } else if (diff > c.threshold) {
      c.verdict = Verdict::kRegression;
    } else if (-diff > c.threshold) {
      c.verdict = Verdict::kImprovement;
    }
    report.regressions += c.verdict == Verdict::kRegression;
    report.improvements += c.verdict == Verdict::kImprovement;
    report.comparisons.push_back(c);
  }
  for (const SummaryRow& s : current)
    if (gated(s.metric) && !seen.count({s.key, s.metric})) {
      Comparison c;
      c.key = s.key;
      c.metric = s.metric;
      c.verdict = Verdict::kNew;
      c.new_mean = s.mean;
      c.new_se = stderr_or_zero(s);
      ++report.added;
      report.comparisons.push_back(c);
    }
  auto rank = [](Verdict v) {
    switch (v) {
      case Verdict::kMissing:
        return 0;
      case Verdict::kRegression:
        return 1;
      case Verdict::kImprovement:
        return 2;
      case Verdict::kNew:
        return 3;
      case Verdict::kOk:
        return 4;
    }
    return 5;
  };
  std::stable_sort(report.comparisons.begin(), report.comparisons.end(), [&](const Comparison& a, const Comparison& b) {
    if (rank(a.verdict) != rank(b.verdict)) return rank(a.verdict) < rank(b.verdict);
    return a.verdict == Verdict::kImprovement ? a.z < b.z : a.z > b.z;
  });
  return report;
}

namespace {
// JSON has no NaN or infinity: NaN is null, ±inf the largest finite double.
nlohmann::ordered_json json_number(double v) {
  if (std::isnan(v)) return nullptr;
  if (std::isinf(v)) return v > 0 ? std::numeric_limits<double>::max() : -std::numeric_limits<double>::max();
  return v;
}
}  // namespace

std::string check_report_json(const CheckReport& report, const CheckOptions& options) {
  nlohmann::ordered_json comparisons = nlohmann::ordered_json::array();
  for (const Comparison& c : report.comparisons) {
    nlohmann::ordered_json item = {{"verdict", verdict_name(c.verdict)}};
    for (const Column<SummaryRow>& column : summary_columns()) {
      if (column.name == "metric") break;  // the key columns come first
      item[column.name] = column.get(SummaryRow{.key = c.key});
    }
    item["metric"] = c.metric;
    item["base_mean"] = json_number(c.base_mean);
    item["base_se"] = json_number(c.base_se);
    item["new_mean"] = json_number(c.new_mean);
    item["new_se"] = json_number(c.new_se);
    item["z"] = json_number(c.z);
    item["threshold"] = json_number(c.threshold);
    comparisons.push_back(std::move(item));
  }
  const nlohmann::ordered_json json = {
      {"options", {{"z", options.z}, {"atol", options.atol}, {"rtol", options.rtol}, {"metrics", options.metrics}}},
      {"failed", report.failed()},
      {"compared", report.compared},
      {"regressions", report.regressions},
      {"missing", report.missing},
      {"improvements", report.improvements},
      {"new", report.added},
      {"comparisons", std::move(comparisons)},
  };
  return json.dump(2) + "\n";
}

}  // namespace attnprobe
