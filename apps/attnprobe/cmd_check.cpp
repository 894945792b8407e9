#include <fmt/format.h>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/output_paths.h"
#include "attnprobe/common/text.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/check.h"
#include "attnprobe/report/summary.h"
#include "attnprobe/report/table.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {

struct CheckCommandOptions {
  std::string current, baseline, json, metrics;
  CheckOptions check;
  bool improvements = false, all = false, metrics_given = false;
};

std::string case_text(const Comparison& c) {
  return fmt::format("{} L{} H{} B{} n={} {}", c.key.dump, c.key.layer.text(), c.key.head.text(), c.key.batch.text(),
                     c.key.n.text(), c.key.spec) +
         (c.key.reference == "softmax" ? "" : " vs " + c.key.reference);
}

std::string mean_se(double mean, double se) { return fmt::format("{:.4g} ± {:.2g}", mean, se); }

int run_check(const CheckCommandOptions& o) {
  CheckOptions options = o.check;
  if (o.metrics_given) {
    for (const std::string& m : split(o.metrics, ',')) options.metrics.push_back(trim(m));
  }
  validate_check_options(options);
  require_separate_files({{"the new run", o.current}, {"--baseline", o.baseline}}, {{"--json", o.json}});
  const std::vector<SummaryRow> baseline = load_gate_input(o.baseline, true);
  const CheckReport report = check_regressions(baseline, load_gate_input(o.current, false), options);

  std::vector<std::vector<std::string>> table = {{"verdict", "case", "metric", "baseline", "new", "z"}};
  for (const Comparison& c : report.comparisons) {
    const bool show = c.verdict == Verdict::kRegression || c.verdict == Verdict::kMissing ||
                      (o.improvements && c.verdict == Verdict::kImprovement) || (c.verdict == Verdict::kNew) || o.all;
    if (!show) continue;
    table.push_back({verdict_name(c.verdict), case_text(c), c.metric, mean_se(c.base_mean, c.base_se),
                     c.verdict == Verdict::kMissing ? "(missing)" : mean_se(c.new_mean, c.new_se),
                     c.verdict == Verdict::kNew ? "" : fmt::format("{:.2f}", c.z)});
  }
  if (table.size() > 1) fmt::print("{}\n", format_table(table));
  fmt::print(
      "check: {} comparisons, {} regressions, {} missing cases, {} improvements, {} new (z = {}, atol = {}, "
      "rtol = {})\n",
      report.compared, report.regressions, report.missing, report.improvements, report.added, options.z, options.atol,
      options.rtol);
  if (!o.json.empty()) {
    write_file_atomically(o.json, check_report_json(report, options));
  }
  if (report.compared == 0 && report.missing == 0) {
    fmt::print(
        "check: FAILED — nothing was compared (no case and metric of the baseline is gated); a gate that "
        "compares nothing passes nothing.\n");
    return exit_code::kRegression;
  }
  if (report.failed()) {
    fmt::print(
        "check: FAILED — {} is worse than {} beyond the tolerance. If the change is intended, refresh the "
        "baseline (tools/baseline.sh --refresh for the project's own).\n",
        o.current, o.baseline);
    return exit_code::kRegression;
  }
  fmt::print("check: passed\n");
  return exit_code::kOk;
}

}  // namespace

Action add_check(CLI::App& app) {
  auto o = std::make_shared<CheckCommandOptions>();
  app.add_option("csv", o->current, "the new run: a trial CSV from sweep/eval, or a summary")->required();
  app.add_option("--baseline", o->baseline, "the baseline: a trial CSV or a summary")->required();
  app.add_option("--z", o->check.z, "standard errors of slack")->capture_default_str();
  app.add_option("--atol", o->check.atol, "absolute slack")->capture_default_str();
  app.add_option("--rtol", o->check.rtol, "slack relative to the baseline mean")->capture_default_str();
  app.add_option("--metrics", o->metrics, "gate only these metrics (e.g. spec_rel,angle); default: all in the baseline")
      ->each([o](const std::string&) { o->metrics_given = true; });
  app.add_flag("--improvements", o->improvements, "also list significant improvements");
  app.add_flag("--all", o->all, "list every comparison, passing ones too");
  app.add_option("--json", o->json, "also write the comparison as JSON to this file");
  app.footer(
      "Example:\n  attnprobe sweep model.h5 -e 'yoso(m=32)' --lengths 512 --trials 16 -o new.csv\n"
      "  attnprobe check new.csv --baseline baseline.csv\n\n"
      "For every case and metric of the baseline, a regression is\n"
      "  worse > z*sqrt(se_new^2 + se_base^2) + atol + rtol*|mean_base|,\n"
      "with worse = mean_new - mean_base (errors and costs), or mean_base - mean_new for the fractions found\n"
      "(topk_recall, mass_recall, kept_overlap, topk_recall@K, eps_cover).\n"
      "Cases of the baseline missing from the new run fail; cases only in the new run are listed as new.\n"
      "Exit code 1 on a regression, a missing case or when nothing was compared; 3 when a file is empty, truncated "
      "or malformed (duplicated cases, negative errors, a statistic that is infinite, >= 1e150 or with a standard "
      "error over 1e6 times its mean, a NaN baseline but for a selection metric where it does not apply; a NaN in the "
      "new run is a regression, 1); 2 for bad options "
      "(--json naming an input included); 0 otherwise.");
  return [o] { return run_check(*o); };
}

}  // namespace attnprobe::cli
