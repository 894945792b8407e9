// attnprobe report (report/html): the Student t quantiles of its intervals against published values, the chart
// primitives, the page built from summaries made up here (so every value on it is known), and the command end to end.
// tests/check_report_browser.py loads a page in headless Chromium.
#include <cmath>
#include <fstream>

#include "attnprobe/common/error.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/records/schema.h"
#include "attnprobe/report/html/html_report.h"
#include "attnprobe/report/html/svg_chart.h"
#include "attnprobe/report/spec_text.h"
#include "attnprobe/report/student_t.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

size_t occurrences(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++count;
  return count;
}

SummaryRow summary(const std::string& spec, int layer, int head, int64_t n, const std::string& metric, double mean,
                   const std::string& dump = "model.h5") {
  SummaryRow row;
  row.key.dump = dump;
  row.key.layer = layer;
  row.key.head = head;
  row.key.batch = 0;
  row.key.n = n;
  row.key.p = 16;
  row.key.estimator = spec.substr(0, spec.find('('));
  row.key.spec = written_spec(spec);
  row.key.reference = "softmax";
  row.metric = metric;
  row.mean = mean;
  row.count = 4;
  row.stderr_ = 0.01 * mean;
  return row;
}

// Two layers × three heads × two lengths of vmean and performer(M=16), and the float32 floor; head (1, 2) is the hard
// one for performer, by construction.
std::vector<SummaryRow> made_up_run(const std::string& dump = "model.h5") {
  std::vector<SummaryRow> rows;
  for (const int64_t n : {64, 128})
    for (int layer = 0; layer < 2; ++layer)
      for (int head = 0; head < 3; ++head) {
        rows.push_back(summary("softmax", layer, head, n, "spec_rel", 1e-7, dump));
        rows.push_back(summary("vmean", layer, head, n, "spec_rel", 0.5 + 0.01 * head, dump));
        rows.push_back(summary("performer(M=16)", layer, head, n, "spec_rel",
                               layer == 1 && head == 2 ? 0.9 : 0.2 + 0.001 * n, dump));
      }
  return rows;
}

}  // namespace

TEST_CASE("Student t quantiles match the published table", "[report]") {
  // Published two-sided 95% critical values (e.g. any statistics table): 12.706, 4.303, 3.182, 2.228, 2.042, 1.960.
  CHECK(student_t_quantile(0.975, 1) == Approx(12.7062047361747).epsilon(1e-9));
  CHECK(student_t_quantile(0.975, 2) == Approx(4.30265272974946).epsilon(1e-9));
  CHECK(student_t_quantile(0.975, 3) == Approx(3.18244630528371).epsilon(1e-9));
  CHECK(student_t_quantile(0.975, 10) == Approx(2.22813885198627).epsilon(1e-9));
  CHECK(student_t_quantile(0.975, 30) == Approx(2.04227245630124).epsilon(1e-9));
  CHECK(student_t_quantile(0.975, 1000) == Approx(1.96233908082694).epsilon(1e-9));
  CHECK(student_t_quantile(0.975, 1e6) == Approx(1.95996398454005).epsilon(1e-5));  // the normal's, nearly
  CHECK(student_t_quantile(0.995, 5) == Approx(4.03214298355523).epsilon(1e-9));
  CHECK(student_t_quantile(0.025, 3) == Approx(-3.18244630528371).epsilon(1e-9));  // symmetric
  CHECK(student_t_quantile(0.5, 7) == 0.0);
  CHECK(student_t_cdf(0, 4) == Approx(0.5).epsilon(1e-15));
  CHECK(student_t_cdf(1, 1) == Approx(0.75).epsilon(1e-12));  // Cauchy: 1/2 + atan(1)/π
  CHECK(std::isnan(student_t_quantile(1.0, 3)));
  CHECK(std::isnan(student_t_quantile(0.9, 0)));
}

TEST_CASE("report axes: ticks, labels and escaping", "[report]") {
  CHECK(axis_ticks(1e-3, 1e3, true) == std::vector<double>{1e-3, 1e-2, 1e-1, 1, 10, 100, 1000});
  // Over eight decades every other power; under two, 1-2-5.
  CHECK(axis_ticks(1e-8, 1e2, true).size() == 6);
  const std::vector<double> fine = axis_ticks(0.15, 3, true);
  CHECK(fine == std::vector<double>{0.2, 0.5, 1, 2});
  const std::vector<double> linear = axis_ticks(0, 1, false);
  REQUIRE(linear.size() == 6);
  CHECK(linear[1] == Approx(0.2));
  CHECK(linear[5] == Approx(1.0));
  CHECK(axis_ticks(1, 1, false).empty());
  CHECK(tick_label(1024) == "1024");
  CHECK(tick_label(0.5) == "0.5");
  CHECK(tick_label(1.25e-5) == "1.25e-05");
  CHECK(html_escape("<a href=\"x\">&'") == "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
  CHECK(palette_colour(0) != palette_colour(1));
  CHECK(palette_colour(0) == palette_colour(20));
}

TEST_CASE("report page: sections, intervals, maps of the hard head, escaping", "[report]") {
  ReportInputs in;
  in.run_path = "run.csv";
  in.run = made_up_run("<script>alert(1)</script>.h5");
  const std::string page = html_report(in);
  for (const std::string id : {"run", "numbers", "ranking", "length", "samples", "heads", "cost", "bias"})
    CHECK(page.find("<section id=\"" + id + "\">") != std::string::npos);
  CHECK(page.find("id=\"gate\"") == std::string::npos);  // no baseline, no gate
  // The dump's name is text, never markup.
  CHECK(page.find("<script>alert") == std::string::npos);
  // Each estimator in its plots/palette.csv colour, the one the figures use.
  for (const auto& [name, colour] : estimator_palette())
    if (name == "performer" || name == "vmean")
      CHECK(page.find("value=\"" + name + "\" checked><i style=\"background:" + colour + "\">") != std::string::npos);
  CHECK(page.find("&lt;script&gt;alert(1)&lt;/script&gt;.h5") != std::string::npos);
  // One map per setting but the float32 floor (softmax), one filter box per estimator, the floor included.
  CHECK(occurrences(page, "<figure class=\"heatmap\"") == 2);
  CHECK(occurrences(page, "<input type=\"checkbox\"") == 3);
  // The hard head's cell says its value; it is the map's maximum, the colour bar's top label.
  CHECK(page.find("layer 1 head 2: spec_rel = 0.9 (1 batch item)") != std::string::npos);
  // A point's interval over the six slices at n = 64 for vmean: mean 0.51, se = sd/√6 of 0.50,0.51,0.52 twice
  // = 0.0036515; t(0.975, 5) = 2.5706 → ±0.009387.
  CHECK(page.find("vmean: spec_rel = 0.51 (n = 64; 95% interval 0.5006 .. 0.5194 over 6 slices)") != std::string::npos);
  // The ranking at n = 128: performer (mean 0.4233: 0.328 on five heads, 0.9 on the hard one) above vmean (0.51),
  // better on 5 of the 6 heads; sign test 2·(1 + 6)/2⁶ = 0.21875.
  // Its Monte-Carlo se: the six slices' trial se (1% of each mean) in quadrature over 6:
  // √(5·0.00328² + 0.009²)/6 = 0.001935; the spread over slices sd/√6 = 0.09533.
  CHECK(page.find("<td>1</td><td>performer(M=16)</td><td>0.4233 ± 0.09533</td><td>0.001935</td>") != std::string::npos);
  CHECK(page.find("<td>vmean</td><td>-0.08667 [") != std::string::npos);
  CHECK(page.find("<td>5 of 6</td><td>0.2188</td>") != std::string::npos);
  // Sections without data say which sweep draws them.
  CHECK(page.find("--samples 16..256:x2") != std::string::npos);
  CHECK(page.find("--metrics all,selection") != std::string::npos);
  CHECK(page.find("--metrics all,case") != std::string::npos);
  CHECK(page.find("No run.json beside the CSV") != std::string::npos);
  // The marks the browser test reads.
  CHECK(page.find("data-ready") != std::string::npos);
  CHECK(page.find("body data-errors=\"0\"") != std::string::npos);

  in.metrics = {"mass_recall"};
  CHECK_THROWS_WITH(html_report(in), Catch::Contains("the run has no such metric; it has spec_rel"));
  in.metrics = {};
  in.run.clear();
  CHECK_THROWS_AS(html_report(in), InputError);
}

TEST_CASE("report page: the gate's verdict against a baseline, case by case", "[report]") {
  ReportInputs in;
  in.run_path = "new.csv";
  in.run = made_up_run();
  in.baseline_path = "base.csv";
  in.baseline = made_up_run();
  CHECK(html_report(in).find("<p class=\"verdict passed\">passed — 36 comparisons, 0 regressions") !=
        std::string::npos);
  // One case of the baseline was better: performer on layer 0 head 0 at n = 128 (0.328 → 0.1, z ≫ 4).
  for (SummaryRow& r : in.baseline)
    if (r.key.estimator == "performer" && r.key.layer == 0 && r.key.head == 0 && r.key.n == 128) r.mean = 0.1;
  const std::string failed = html_report(in);
  CHECK(failed.find("<p class=\"verdict failed\">FAILED — 36 comparisons, 1 regressions") != std::string::npos);
  CHECK(failed.find("<tr data-estimator=\"performer\"><td>regression</td><td>model.h5 L0 H0 B0 n=128 "
                    "performer(M=16)</td>") != std::string::npos);
}

TEST_CASE("report: the diagnostics CSV reads back what diagnose writes, and bad ones are refused", "[report]") {
  DiagnosticRow row;
  row.dump = "d, \"quoted\".h5";
  row.layer = 1;
  row.head = 0;
  row.batch = 2;
  row.n = 512;
  row.p = 64;
  row.mask = Mask::kWindow;
  row.window = 32;
  row.queries = *parse_query_rows("last:4");
  row.diagnostic = "entropy";
  row.value = 3.25;
  const std::string path = temp_path("diagnostics.csv");
  {
    std::ofstream out(path);
    out << csv_text(diagnostic_columns(), std::vector<DiagnosticRow>{row});
  }
  const std::vector<DiagnosticRow> back = read_diagnostics_csv(path);
  REQUIRE(back.size() == 1);
  CHECK(csv_text(diagnostic_columns(), back) == csv_text(diagnostic_columns(), std::vector<DiagnosticRow>{row}));

  const auto refuse = [&](const std::string& text, const std::string& message) {
    const std::string bad = temp_path("bad-diagnostics.csv");
    std::ofstream(bad) << text;
    CHECK_THROWS_WITH(read_diagnostics_csv(bad), Catch::Contains(message));
  };
  const std::string header = csv_header(diagnostic_columns()) + "\n";
  refuse("", "has no complete line");
  refuse("dump,layer\n", "is not a diagnostics CSV");
  refuse(header + "d.h5,0,0,0,64,16,full,all,entropy,nan\n", "line 2: the diagnostic entropy is nan");
  refuse(header + "d.h5,x,0,0,64,16,full,all,entropy,1\n", "line 2: column layer is 'x'");
  refuse(header + "d.h5,0,0,0,64,16,full,all,entropy\n", "line 2: 9 fields where the header has 10");
}

TEST_CASE("attnprobe report end to end: sweep, diagnose, report with a baseline", "[report][cli]") {
  const std::string dump = write_synth("report.h5", synth_options(2, 2, 1, 128, 16, {0.2, 2.0}));
  const std::string run = temp_path("report-run.csv"), diag = temp_path("report-diag.csv"),
                    page = temp_path("report.html");
  REQUIRE(run_attnprobe("sweep " + dump +
                        " -e softmax -e vmean -e performer -e yoso --samples 8,16 --lengths 64,128 --trials 3 "
                        "--metrics all,case -q -o " +
                        run)
              .exit_code == 0);
  REQUIRE(run_attnprobe("diagnose " + dump + " --lengths 128 -q -o " + diag).exit_code == 0);
  const CommandResult r = run_attnprobe("report " + run + " " + run + " --diagnostics " + diag + " -o " + page);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("open it in a browser") != std::string::npos);
  const std::string html = read_text(page);
  CHECK(html.find("<p class=\"verdict passed\">passed") != std::string::npos);  // a run against itself
  CHECK(html.find("diagnostic: entropy") != std::string::npos);
  CHECK(html.find("spec_rel against samples") != std::string::npos);
  CHECK(html.find("bias and one trial&#39;s spread") != std::string::npos);
  CHECK(html.find("attnprobe report " + run) != std::string::npos);  // the command that wrote it
  CHECK(html.find("sweep " + dump) != std::string::npos);            // run.json's command

  // Bad input: a clear error and its exit code, no page.
  CHECK(run_attnprobe("report " + run + " -o " + run).exit_code == 2);  // would overwrite the run
  CHECK(run_attnprobe("report " + temp_path("missing.csv") + " -o " + page).exit_code == 3);
  CHECK(run_attnprobe("report " + run + " --metric nmse_typo -o " + page).exit_code == 2);
  CHECK(run_attnprobe("report " + run + " --diagnostics " + run + " -o " + page).exit_code == 3);
  CHECK(run_attnprobe("report " + run + " --z -1 -o " + page).exit_code == 2);
}
