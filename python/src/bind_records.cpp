// attnprobe._core's rows (docs/python.md): DataFrames handed over as text fields in the schema's column
// order, parsed and checked as the CSV readers do, then summarised or gated by the library.
#include <pybind11/stl.h>

#include <filesystem>
#include <string>
#include <vector>

#include "attnprobe/common/error.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/records/schema.h"
#include "attnprobe/report/check.h"
#include "attnprobe/report/compare.h"
#include "attnprobe/report/html/html_report.h"
#include "attnprobe/report/run_info.h"
#include "attnprobe/report/summary.h"
#include "bindings.h"

namespace attnprobe::python {

namespace {

// Rows handed over from pandas as text fields in the schema's column order (the Python layer formats
// them), parsed by the schema's own column table.
// A negative value of one of attnprobe's metrics is refused as the CSV readers refuse it.
template <class Row>
std::vector<Row> parse_rows(const std::vector<Column<Row>>& columns, const std::vector<std::vector<std::string>>& rows,
                            const std::string& what) {
  std::vector<Row> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = fmt::format("{} row {}", what, i);
    parse_row(columns, rows[i], where, out[i]);
    require_possible_values(where, out[i]);
  }
  return out;
}

// Rows for the gate, validated as `attnprobe check` validates its files (report/check.h, gate_input).
std::vector<SummaryRow> gate_rows(bool summary, const std::vector<std::vector<std::string>>& rows,
                                  const std::string& what, bool baseline) {
  CsvContents contents;
  contents.summary = summary;
  if (summary)
    contents.summaries = parse_rows(summary_columns(), rows, what);
  else
    contents.trials = parse_rows(trial_columns(), rows, what);
  for (size_t i = 0; i < rows.size(); ++i) contents.row_places.push_back(fmt::format("{} row {}", what, i));
  return gate_input(contents, what, baseline);
}

// Rows handed over from pandas, validated like the CSV readers' (read_csv's check of a DataFrame).
void validate_rows(bool summary, const std::vector<std::vector<std::string>>& rows) {
  if (summary)
    parse_rows(summary_columns(), rows, "summary");
  else
    parse_rows(trial_columns(), rows, "trial");
}

std::string summarize(bool summary, const std::vector<std::vector<std::string>>& rows,
                      const std::vector<std::string>& over) {
  std::vector<SummaryRow> result;
  {
    py::gil_scoped_release release;
    result = summary ? parse_rows(summary_columns(), rows, "summary")
                     : summarize_trials(parse_rows(trial_columns(), rows, "trial"));
    if (!over.empty()) {
      result = summarize_over(result, over);
    } else {
      require_usage(!summary, "the input is already a summary; give over=[...] to aggregate it further");
    }
  }
  return summary_csv_text(result);
}

// `summarize --compare A B` (report/compare.h) of trial rows or per-case summaries, as its CSV text.
std::string compare(bool summary, const std::vector<std::vector<std::string>>& rows, const std::string& a,
                    const std::string& b) {
  py::gil_scoped_release release;
  const std::vector<SummaryRow> per_case = summary ? parse_rows(summary_columns(), rows, "summary")
                                                   : summarize_trials(parse_rows(trial_columns(), rows, "trial"));
  return comparison_csv_text(compare_paired(per_case, a, b));
}

std::string check(bool new_summary, const std::vector<std::vector<std::string>>& new_rows, bool base_summary,
                  const std::vector<std::vector<std::string>>& base_rows, double z, double atol, double rtol,
                  const std::vector<std::string>& metric_names) {
  CheckOptions options{z, atol, rtol, metric_names};
  py::gil_scoped_release release;
  validate_check_options(options);
  const CheckReport report = check_regressions(gate_rows(base_summary, base_rows, "baseline", true),
                                               gate_rows(new_summary, new_rows, "new", false), options);
  return check_report_json(report, options);
}

// `attnprobe report` (report/html/html_report.h) of rows handed over from pandas: the page's text. `run_csv` is the
// CSV the rows were read from ("" for a DataFrame), whose run.json the page shows; `baseline_name` "" means no
// baseline.
std::string report(bool summary, const std::vector<std::vector<std::string>>& rows, const std::string& run_csv,
                   bool base_summary, const std::vector<std::vector<std::string>>& base_rows,
                   const std::string& baseline_name, const std::string& diagnostics,
                   const std::vector<std::string>& metrics, double z, double atol, double rtol) {
  ReportInputs inputs;
  inputs.gate = CheckOptions{z, atol, rtol, {}};
  py::gil_scoped_release release;
  validate_check_options(inputs.gate);
  inputs.run_path = run_csv.empty() ? "the DataFrame" : run_csv;
  inputs.run = gate_rows(summary, rows, inputs.run_path, false);
  if (!run_csv.empty() && std::filesystem::exists(existing_run_info_path(run_csv)))
    inputs.run_info = read_run_info(existing_run_info_path(run_csv));
  if (!baseline_name.empty()) {
    inputs.baseline_path = baseline_name;
    inputs.baseline = gate_rows(base_summary, base_rows, baseline_name, true);
  }
  if (!diagnostics.empty()) inputs.diagnostics = read_diagnostics_csv(diagnostics);
  inputs.metrics = metrics;
  inputs.generated_by = "attnprobe.report() (Python)";
  return html_report(inputs);
}

std::vector<std::string> column_names(bool summary) {
  std::vector<std::string> names;
  if (summary)
    for (const auto& c : summary_columns()) names.push_back(c.name);
  else
    for (const auto& c : trial_columns()) names.push_back(c.name);
  return names;
}

}  // namespace

void bind_records(py::module_& m) {
  m.def("column_names", &column_names);
  m.def("summarize", &summarize);
  m.def("compare", &compare);
  m.def("check", &check);
  m.def("report", &report);
  m.def("validate_rows", &validate_rows);
}

}  // namespace attnprobe::python
