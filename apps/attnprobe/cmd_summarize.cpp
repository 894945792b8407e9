#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/output_paths.h"
#include "attnprobe/common/text.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/compare.h"
#include "attnprobe/report/pareto.h"
#include "attnprobe/report/slopes.h"
#include "attnprobe/report/spec_text.h"
#include "attnprobe/report/summary.h"
#include "attnprobe/report/table.h"
#include "attnprobe/report/wide.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {
struct SummarizeOptions {
  std::vector<std::string> inputs;
  std::string over;
  std::string output;
  bool table = false;
  bool slopes = false;
  std::string pareto;
  std::vector<std::string> compare;
  bool wide = false;
  std::string metrics;
};

// The CSV text to -o (atomically) or standard output.
void emit(const SummarizeOptions& o, const std::string& text) {
  if (o.output.empty() || o.output == "-")
    std::fwrite(text.data(), 1, text.size(), stdout);
  else
    write_file_atomically(o.output, text);
}

// Keeps the summaries of the metrics --metrics names (and `keep`, e.g. the Pareto axis); a name no summary has is a
// usage error listing those present.
std::vector<SummaryRow> only_metrics(std::vector<SummaryRow> rows, const std::string& list, const std::string& keep) {
  if (list.empty()) return rows;
  std::vector<std::string> present;
  for (const SummaryRow& s : rows)
    if (std::find(present.begin(), present.end(), s.metric) == present.end()) present.push_back(s.metric);
  std::vector<std::string> wanted;
  for (const std::string& raw : split(list, ',')) {
    const std::string name = trim(raw);
    if (std::find(present.begin(), present.end(), name) == present.end())
      throw UsageError(
          fmt::format("--metrics: no summary has the metric '{}'; the input has {}", name, join(present, ",")));
    wanted.push_back(name);
  }
  if (!keep.empty()) wanted.push_back(keep);
  std::erase_if(rows,
                [&](const SummaryRow& s) { return std::find(wanted.begin(), wanted.end(), s.metric) == wanted.end(); });
  return rows;
}

int print_wide(const std::vector<SummaryRow>& rows, const SummarizeOptions& o) {
  const WideTable wide = wide_summary(rows, o.table);
  if (o.table) {
    std::vector<std::vector<std::string>> table = {wide.header};
    table.insert(table.end(), wide.rows.begin(), wide.rows.end());
    fmt::print("{}", format_table(table));
    if (o.output.empty()) return 0;
  }
  const WideTable values = o.table ? wide_summary(rows, false) : wide;
  std::string text = join(values.header, ",") + "\n";
  for (const std::vector<std::string>& row : values.rows) {
    std::vector<std::string> fields;
    for (const std::string& field : row) fields.push_back(csv_field(field));
    text += join(fields, ",") + "\n";
  }
  emit(o, text);
  return 0;
}

// Whether some row is computed in another precision than f32 (--precision): then the tables name it.
template <class Row>
bool any_rounded(const std::vector<Row>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.key.precision != Precision::kF32; });
}

int print_comparison(const std::vector<SummaryRow>& per_case, const SummarizeOptions& o) {
  const std::vector<ComparisonRow> rows = compare_paired(per_case, o.compare[0], o.compare[1]);
  if (o.table) {
    const bool decode =
        std::any_of(rows.begin(), rows.end(), [](const ComparisonRow& r) { return !r.key.queries.all(); });
    std::vector<std::vector<std::string>> table = {{"dump", "n", "reference", "metric", "heads", "mean_a", "mean_b",
                                                    "diff", "95% interval", "a_better", "b_better", "ties", "sign_p",
                                                    "A/B", "mc_stderr", "head_sd"}};
    const bool rounded = any_rounded(rows);
    if (rounded) table[0].insert(table[0].begin() + 2, "precision");
    if (decode) table[0].insert(table[0].begin() + 2, "queries");
    for (const ComparisonRow& r : rows) {
      table.push_back({r.key.dump, r.key.n.text(), r.key.reference, r.metric, std::to_string(r.heads),
                       fmt::format("{:.4g}", r.mean_a), fmt::format("{:.4g}", r.mean_b), fmt::format("{:.3g}", r.diff),
                       fmt::format("[{:.3g}, {:.3g}]", r.ci_low, r.ci_high), std::to_string(r.a_better),
                       std::to_string(r.b_better), std::to_string(r.ties), fmt::format("{:.2g}", r.sign_p),
                       fmt::format("{:.3g}", r.median_ratio), fmt::format("{:.2g}", r.mc_stderr),
                       fmt::format("{:.2g}", r.head_sd)});
      if (rounded) table.back().insert(table.back().begin() + 2, precision_name(r.key.precision));
      if (decode) table.back().insert(table.back().begin() + 2, query_rows_text(r.key.queries));
    }
    fmt::print("A = {}\nB = {}\n{}", rows.front().a, rows.front().b, format_table(table));
    if (o.output.empty()) return 0;
  }
  emit(o, comparison_csv_text(rows));
  return 0;
}

int print_slopes(const std::vector<SummaryRow>& per_case, const SummarizeOptions& o) {
  const std::vector<SlopeRow> slopes = fit_slopes(per_case);
  if (slopes.empty())
    throw UsageError("--slopes needs each case at two or more sample counts (sweep with --samples 8..128:x2)");
  if (o.table) {
    std::vector<std::vector<std::string>> rows = {
        {"layer", "head", "batch", "n", "spec", "reference", "metric", "points", "slope", "stderr"}};
    for (const SlopeRow& s : slopes)
      rows.push_back({s.key.layer.text(), s.key.head.text(), s.key.batch.text(), s.key.n.text(), brief_spec(s.key.spec),
                      brief_spec(s.key.reference), s.metric, std::to_string(s.points), fmt::format("{:.3f}", s.slope),
                      fmt::format("{:.3f}", s.stderr_)});
    fmt::print("{}", format_table(rows));
    if (o.output.empty()) return 0;
  }
  emit(o, slopes_csv_text(slopes));
  return 0;
}

int print_pareto(const std::vector<SummaryRow>& per_case, const SummarizeOptions& o) {
  const std::vector<ParetoRow> fronts = pareto_fronts(per_case, o.pareto);
  if (o.table) {
    std::vector<std::vector<std::string>> rows = {
        {"layer", "head", "batch", "n", "queries", "estimator", "spec", "metric", o.pareto, "value"}};
    const bool rounded = any_rounded(fronts);
    if (rounded) rows[0].insert(rows[0].begin() + 5, "precision");
    for (const ParetoRow& r : fronts) {
      rows.push_back({r.key.layer.text(), r.key.head.text(), r.key.batch.text(), r.key.n.text(),
                      query_rows_text(r.key.queries), r.key.estimator, brief_spec(r.key.spec), r.metric,
                      fmt::format("{:.4g}", r.axis), fmt::format("{:.4g}", r.value)});
      if (rounded) rows.back().insert(rows.back().begin() + 5, precision_name(r.key.precision));
    }
    fmt::print("{}", format_table(rows));
    if (o.output.empty()) return 0;
  }
  emit(o, pareto_csv_text(fronts, o.pareto));
  return 0;
}

int run_summarize(const SummarizeOptions& o) {
  if (o.slopes + !o.pareto.empty() + !o.compare.empty() > 1)
    throw UsageError("--slopes, --pareto and --compare are three outputs: ask for one");
  if (!o.compare.empty() && !o.over.empty())
    throw UsageError("--compare pools over heads itself (batch items averaged per head): leave out --over");
  if (o.wide && (o.slopes || !o.pareto.empty() || !o.compare.empty()))
    throw UsageError("--wide lays out the summary itself; --slopes, --pareto and --compare have their own layouts");
  std::vector<NamedPath> inputs;
  for (const std::string& path : o.inputs) inputs.push_back({"the input", path});
  require_separate_files(inputs, {{"-o", o.output == "-" ? "" : o.output}});
  std::vector<TrialRow> trials;
  std::vector<SummaryRow> summaries;
  for (const std::string& path : o.inputs) {
    CsvContents c = read_csv(path);
    if (c.truncated_tail)
      fmt::print(stderr, "note: '{}' ends in a partial line (an interrupted run?); ignored it\n", path);
    trials.insert(trials.end(), c.trials.begin(), c.trials.end());
    summaries.insert(summaries.end(), c.summaries.begin(), c.summaries.end());
  }
  if (trials.empty() && summaries.empty())
    throw InputError(fmt::format("{} {} a header but no rows: nothing to summarize. Did the run fail?",
                                 join(o.inputs, ", "), o.inputs.size() == 1 ? "has" : "have"));
  if (!trials.empty() && !summaries.empty())
    throw InputError(
        "mixing trial CSVs and summary CSVs: summarize the trial CSVs, or give summaries only with --over");
  std::vector<SummaryRow> result =
      only_metrics(trials.empty() ? summaries : summarize_trials(trials, join(o.inputs, ", ")), o.metrics, o.pareto);
  if (!o.compare.empty()) return print_comparison(result, o);
  if (!o.over.empty()) {
    std::vector<std::string> columns;
    for (const std::string& c : split(o.over, ',')) columns.push_back(trim(c));
    result = summarize_over(result, columns);
  } else if (trials.empty()) {
    throw UsageError("the input is already a summary; add --over layer,head,... to aggregate it further");
  }

  if (o.slopes) return print_slopes(result, o);
  if (!o.pareto.empty()) return print_pareto(result, o);
  if (o.wide) return print_wide(result, o);
  if (o.table) {
    // The query rows only when some case evaluates other rows than all (a decode sweep).
    const bool decode =
        std::any_of(result.begin(), result.end(), [](const SummaryRow& s) { return !s.key.queries.all(); });
    std::vector<std::vector<std::string>> rows = {
        {"layer", "head", "batch", "n", "spec", "reference", "metric", "count", "mean", "stderr", "median"}};
    const bool rounded = any_rounded(result);
    if (rounded) rows[0].insert(rows[0].begin() + 4, "precision");
    if (decode) rows[0].insert(rows[0].begin() + 4, "queries");
    for (const SummaryRow& s : result) {
      rows.push_back({s.key.layer.text(), s.key.head.text(), s.key.batch.text(), s.key.n.text(), brief_spec(s.key.spec),
                      brief_spec(s.key.reference), s.metric, std::to_string(s.count), fmt::format("{:.6g}", s.mean),
                      fmt::format("{:.3g}", s.stderr_), fmt::format("{:.6g}", s.median)});
      if (rounded) rows.back().insert(rows.back().begin() + 4, precision_name(s.key.precision));
      if (decode) rows.back().insert(rows.back().begin() + 4, query_rows_text(s.key.queries));
    }
    fmt::print("{}", format_table(rows));
    if (o.output.empty()) return 0;
  }
  emit(o, summary_csv_text(result));
  if (!o.output.empty() && o.output != "-")
    fmt::print(stderr, "wrote {} summary rows to {}\n", result.size(), o.output);
  return 0;
}
}  // namespace

Action add_summarize(CLI::App& app) {
  auto o = std::make_shared<SummarizeOptions>();
  app.add_option("csv", o->inputs, "trial CSVs written by sweep/eval (or summaries, with --over)")->required();
  app.add_option("--over", o->over,
                 "aggregate across these columns (any of layer,head,batch,n): each slice's mean counts once, and the "
                 "standard error treats slices as the replicates");
  app.add_option("-o,--output", o->output, "write the summary CSV here (default: standard output)");
  app.add_flag("--slopes", o->slopes,
               "fit log(mean error) against log(samples) per case and metric (over the sweep's --samples): "
               "a Monte-Carlo estimator falls as -1/2 for norms (spec_rel, fro_rel) and -1 for squared errors "
               "(mse, nmse); flatter means bias. Columns: the case key but samples, metric, points, slope, "
               "stderr, intercept, min_samples, max_samples");
  app.add_option("--pareto", o->pareto,
                 "AXIS (e.g. density): per case and estimator, the settings on its error-vs-AXIS front — none of the "
                 "estimator's other settings reads no more and errs less (for recalls: finds more). With --over, "
                 "the front of the pooled means. Columns: the case key, metric, AXIS, value");
  app.add_option("--compare", o->compare,
                 "A B: the two settings (specs) paired slice by slice, per n, queries, reference and metric, with "
                 "the head as the replicate (its batch items averaged): mean_a, mean_b, diff = mean(A - B), a 95% "
                 "bootstrap interval of diff over heads, the heads where each is better and the two-sided sign test, "
                 "the median ratio A/B, and apart, the Monte-Carlo stderr of diff (trials) and the heads' sd")
      ->expected(2);
  app.add_flag("--wide", o->wide,
               "one row per setting and metric, one column per length (or per samples value when the sweep varies "
               "the samples at one length), settings named by their non-default keys; with --table, mean ± stderr "
               "cells, else a CSV of the means");
  app.add_option("--metrics", o->metrics, "only these metrics (a list of names the input has, e.g. spec_rel,angle)");
  app.add_flag("--table", o->table, "print an aligned table instead of CSV (with -o, both)");
  app.footer(
      "Example:\n  attnprobe summarize out/sweep.csv -o out/summary.csv\n"
      "  attnprobe summarize out/sweep.csv --over layer,head,batch --table\n"
      "  attnprobe summarize out/sweep.csv --over layer,head,batch --wide --metrics spec_rel --table\n"
      "  attnprobe summarize out/sweep.csv --over layer,head,batch --slopes --table\n"
      "  attnprobe summarize out/decode.csv --over layer,head,batch --pareto density --table\n"
      "  attnprobe summarize out/sweep.csv --compare 'skeinformer(d=64)' 'nystrom(L=64)' --table\n\n"
      "Columns: " +
      csv_header(summary_columns()) + " (std with n-1; stderr = std/sqrt(count)).");
  return [o] { return run_summarize(*o); };
}

}  // namespace attnprobe::cli
