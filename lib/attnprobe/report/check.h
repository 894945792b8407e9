#pragma once
// The regression gate (`attnprobe check`, docs/csv.md "check", docs/cli.md "Exit codes"): compares per-case statistics
// of a new run with a baseline. For every (case, metric) of the baseline a regression is
//   worse_by > z·sqrt(se_new² + se_base²) + atol + rtol·|mean_base|,
// with worse_by = mean_new − mean_base for the errors (larger is worse: every metric but topk_recall) and
// mean_base − mean_new for topk_recall (larger is better; larger_is_better in metrics.h),
// a case of the baseline missing from the new run is a failure, and a value that became NaN is one.
// The gate fails closed: inputs are validated before comparing (load_gate_input: exit 3 for an
// empty, truncated, duplicated, negative or non-finite file), options too (validate_check_options:
// exit 2), and a comparison that compared nothing fails.
#include <string>
#include <vector>

#include "attnprobe/records/csv.h"
#include "attnprobe/records/record.h"

namespace attnprobe {

struct CheckOptions {
  double z = 4.0;                    ///< standard errors of slack (deterministic cases have se = 0)
  double atol = 1e-9;                ///< absolute slack: float rounding of values near 0 (zero_rows, tiny errors)
  double rtol = 1e-3;                ///< relative slack: float rounding differences between builds and CPUs
  std::vector<std::string> metrics;  ///< gate only these; empty = all in the baseline
};

enum class Verdict { kOk, kRegression, kImprovement, kMissing, kNew };

struct Comparison {
  CaseKey key;
  std::string metric;
  Verdict verdict = Verdict::kOk;
  double base_mean = 0, base_se = 0, new_mean = 0, new_se = 0;
  double z = 0;  ///< how much worse, (new − base) / sqrt(se² + se²) (sign flipped for topk_recall); ±inf when both se
                 ///< are 0 and means differ
  double threshold = 0;  ///< the allowed increase
};

struct CheckReport {
  std::vector<Comparison> comparisons;  ///< sorted: regressions and missing by severity, then the rest
  int regressions = 0, missing = 0, improvements = 0, added = 0, compared = 0;
  /// A regression, a missing case, or nothing compared at all (an empty gate passes nothing).
  bool failed() const { return regressions > 0 || missing > 0 || compared == 0; }
};

/// Reads a trial CSV (summarised here) or a summary CSV for the gate. Throws InputError naming the
/// file and row when it has no rows, ends in a line without its newline, repeats a case (or a
/// trial), has an unknown metric, a negative or −inf error, a count < 1, a negative spread or a NaN one beside a count
/// above 1;
/// and, for the baseline (`baseline` true), a mean that is not finite (nothing to hold a run to).
std::vector<SummaryRow> load_gate_input(const std::string& path, bool baseline);
/// The same validation and summary of rows already parsed (the Python package's check() of DataFrames);
/// `source` names them in the errors. Every metric attnprobe computes can be gated: per trial, per case
/// (rows of trial −1), attention weights and gradients.
std::vector<SummaryRow> gate_input(const CsvContents& contents, const std::string& source, bool baseline);

/// Throws UsageError unless z, atol and rtol are finite and >= 0 and every gated metric is a known one.
void validate_check_options(const CheckOptions& options);

CheckReport check_regressions(const std::vector<SummaryRow>& baseline, const std::vector<SummaryRow>& current,
                              const CheckOptions& options);

const char* verdict_name(Verdict verdict);
/// A JSON document of the report, for other tools.
std::string check_report_json(const CheckReport& report, const CheckOptions& options);

}  // namespace attnprobe
