#pragma once
// `attnprobe report` (docs/report.md): one self-contained HTML page of a run — what produced it, the numbers per
// setting, their ranking with the paired comparison over heads behind each step, error against length and against
// samples with 95% intervals over heads, which heads are hard (a layer × head map per setting), error against cost (the
// fronts over keys read), bias against variance, and with a baseline the regression gate's verdict case by case. No
// network at view time: the charts are inline SVG (svg_chart.h) and the little script only filters by estimator.
#include <optional>
#include <string>
#include <vector>

#include "attnprobe/records/record.h"
#include "attnprobe/report/check.h"
#include "attnprobe/report/run_info.h"

namespace attnprobe {

struct ReportInputs {
  std::string run_path;                    ///< the run's CSV, as given (shown)
  std::vector<SummaryRow> run;             ///< its per-case summaries (load_gate_input)
  std::optional<RunInfo> run_info;         ///< its run.json, when one is beside it
  std::string baseline_path;               ///< "" without a baseline
  std::vector<SummaryRow> baseline;        ///< the baseline's per-case summaries
  CheckOptions gate;                       ///< the gate's tolerances, as `check` takes them
  std::vector<DiagnosticRow> diagnostics;  ///< head diagnostics (`attnprobe diagnose`), drawn beside the maps
  std::vector<std::string> metrics;        ///< the metrics to draw; empty: those of kDefaultReportMetrics present
  std::string generated_by;                ///< the command line that wrote the page
};

/// The metrics a report draws when none are asked for, those present in the run (at most three): the spectral error
/// (what the seed papers report), the angle between output rows, and the kept attention mass of the selections.
inline const std::vector<std::string> kDefaultReportMetrics = {"spec_rel", "angle", "row_tv", "mass_recall"};

/// The page. Throws UsageError when a metric asked for is not in the run (naming those that are) and InputError
/// when the run has no rows.
std::string html_report(const ReportInputs& inputs);

}  // namespace attnprobe
