#include <fmt/format.h>

#include <filesystem>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/output_paths.h"
#include "attnprobe/common/text.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/check.h"
#include "attnprobe/report/html/html_report.h"
#include "attnprobe/report/run_info.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {

struct ReportCommandOptions {
  std::string run, baseline, output = "report.html", diagnostics;
  std::vector<std::string> metrics;
  CheckOptions gate;
};

int run_report(const ReportCommandOptions& o, const Globals& globals) {
  validate_check_options(o.gate);
  require_separate_files({{"the run", o.run}, {"the baseline", o.baseline}, {"--diagnostics", o.diagnostics}},
                         {{"-o", o.output}});
  ReportInputs inputs;
  inputs.run_path = o.run;
  inputs.run = load_gate_input(o.run, false);
  const std::string info_path = existing_run_info_path(o.run);
  if (std::filesystem::exists(info_path)) inputs.run_info = read_run_info(info_path);
  if (!o.baseline.empty()) {
    inputs.baseline_path = o.baseline;
    inputs.baseline = load_gate_input(o.baseline, true);
  }
  if (!o.diagnostics.empty()) inputs.diagnostics = read_diagnostics_csv(o.diagnostics);
  inputs.gate = o.gate;
  for (const std::string& m : o.metrics)
    for (const std::string& part : split(m, ',')) inputs.metrics.push_back(trim(part));
  inputs.generated_by = join(globals.argv, " ");
  const std::string page = html_report(inputs);
  write_file_atomically(o.output, page);
  fmt::print("wrote {} ({} KiB): open it in a browser\n", o.output, (page.size() + 1023) / 1024);
  return 0;
}

}  // namespace

Action add_report(CLI::App& app, const Globals& globals) {
  auto o = std::make_shared<ReportCommandOptions>();
  app.add_option("run", o->run, "the run: a trial CSV from sweep/eval/merge (or a summary CSV)")->required();
  app.add_option("baseline", o->baseline,
                 "optional: a baseline CSV; the page then shows the regression gate's verdict case by case");
  app.add_option("-o,--output", o->output, "the HTML file to write")->capture_default_str();
  app.add_option("--metric,--metrics", o->metrics,
                 "the metrics to draw, repeatable or comma-separated (default: those of spec_rel, angle, row_tv, "
                 "mass_recall in the run, at most three)");
  app.add_option("--diagnostics", o->diagnostics,
                 "head diagnostics from `attnprobe diagnose` at the run's lengths, drawn beside the per-head maps");
  app.add_option("--z", o->gate.z, "the gate's standard errors of slack (as check)")->capture_default_str();
  app.add_option("--atol", o->gate.atol, "the gate's absolute slack (as check)")->capture_default_str();
  app.add_option("--rtol", o->gate.rtol, "the gate's relative slack (as check)")->capture_default_str();
  app.footer(
      "Example:\n"
      "  attnprobe sweep model.h5 -e vmean -e performer -e 'yoso(m=32)' --lengths 256..4096:x2 --metrics all,case \\\n"
      "      -o out/sweep.csv\n"
      "  attnprobe diagnose model.h5 --lengths 4096 -o out/diag.csv\n"
      "  attnprobe report out/sweep.csv -o out/report.html --diagnostics out/diag.csv\n"
      "  attnprobe report out/new.csv base.csv -o out/gate.html     # with the gate's verdict\n\n"
      "One self-contained HTML file (no network needed to view it): the run's context from its run.json, a table\n"
      "per metric, the ranking (each step backed by the paired comparison over heads), error against length and\n"
      "against the samples knob with 95% intervals over slices, a layer x head map per setting (which heads are\n"
      "hard), error against keys read (with --metrics all,selection in the sweep), bias against one trial's spread\n"
      "(with --metrics all,case), and with a baseline the gate of `attnprobe check`. Sections the run has no data\n"
      "for say which sweep option draws them. Hover a point or a cell for its case;\n"
      "the checkboxes at the top hide estimators. docs/report.md explains each section.");
  return [o, &globals] { return run_report(*o, globals); };
}

}  // namespace attnprobe::cli
