// The regression gate: an identical rerun and a rerun with other seeds pass; an injected
// regression and a missing case fail with exit 1 and name the case; every registered estimator
// has a committed baseline.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/check.h"
#include "attnprobe/report/summary.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {
std::string gate_dump() {
  static const std::string path = [] { return write_synth("gate.h5", synth_options(2, 2, 1, 128, 16, {0.2, 1.0})); }();
  return path;
}

std::string sweep(const std::string& name, const std::string& args) {
  const std::string out = temp_path(name);
  const auto r = run_attnprobe("sweep " + gate_dump() + " " + args + " --trials 16 -q --overwrite -o " + out);
  REQUIRE(r.exit_code == 0);
  return out;
}

const std::string kGrid = "-e vmean -e 'yoso(m=32)' -e 'performer(M=64)' -e 'lara(C=32)' -e 'skeinformer(d=32)'";
}  // namespace

TEST_CASE("check passes an identical rerun", "[check]") {
  const std::string base = sweep("base.csv", kGrid + " --seed 0");
  const std::string again = sweep("again.csv", kGrid + " --seed 0");
  const auto r = run_attnprobe("check " + again + " --baseline " + base);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("0 regressions") && Catch::Contains("passed"));
}

TEST_CASE("check passes a rerun with other seeds (noise only)", "[check]") {
  const std::string base = sweep("seed0.csv", kGrid + " --seed 0");
  const std::string other = sweep("seed1.csv", kGrid + " --seed 1");
  const std::string json = temp_path("seeds.json");
  const auto r = run_attnprobe("check " + other + " --baseline " + base + " --json " + json);
  INFO(r.output);
  // 4 slices × 5 settings × 9 metrics = 180 comparisons at z = 4; random settings differ only by
  // noise. Observed largest |z| over the 180: 2.52 (seed 0 vs 1; the JSON has them all).
  CHECK(r.exit_code == 0);
  CHECK_THAT(read_text(json), Catch::Contains("\"failed\": false"));
}

TEST_CASE("check fails an injected regression and names the case", "[check]") {
  // Baseline from yoso(m=64); the "new" run is yoso(m=16) relabelled as m=64: 4× fewer hashes
  // under the same case names, as a change that silently weakened the estimator would look.
  const std::string base = sweep("m64.csv", "-e 'yoso(m=64)' --layers 0");
  const std::string weak = sweep("m16.csv", "-e 'yoso(m=16)' --layers 0");
  std::string text = read_text(weak);
  text = std::regex_replace(text, std::regex("yoso\\(m=16,"), "yoso(m=64,");
  text = std::regex_replace(text, std::regex(",yoso,(\"yoso\\(m=64[^\"]*\"),16,"), ",yoso,$1,64,");
  const std::string relabelled = temp_path("relabelled.csv");
  std::ofstream(relabelled) << text;
  const auto r = run_attnprobe("check " + relabelled + " --baseline " + base);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("regression") &&
                           Catch::Contains("yoso(m=64,tau=8,hash=gauss,norm=l2,input=l2,grad=lsh)") &&
                           Catch::Contains("L0 H0 B0 n=128") && Catch::Contains("FAILED"));
  // And --improvements in the other direction: m=16 as baseline, m=64 relabelled as new.
  std::string better = std::regex_replace(read_text(base), std::regex("yoso\\(m=64,"), "yoso(m=16,");
  better = std::regex_replace(better, std::regex(",yoso,(\"yoso\\(m=16[^\"]*\"),64,"), ",yoso,$1,16,");
  const std::string improved = temp_path("improved.csv");
  std::ofstream(improved) << better;
  const auto i = run_attnprobe("check " + improved + " --baseline " + weak + " --improvements");
  CHECK(i.exit_code == 0);
  CHECK_THAT(i.output, Catch::Contains("improvement"));
}

TEST_CASE("check fails when a baseline case is missing and reports new cases", "[check]") {
  const std::string base = sweep("both.csv", "-e vmean -e 'yoso(m=8)'");
  const std::string fewer = sweep("fewer.csv", "-e vmean --layers 0");
  const auto r = run_attnprobe("check " + fewer + " --baseline " + base);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("missing"));
  const auto added = run_attnprobe("check " + base + " --baseline " + fewer);
  CHECK(added.exit_code == 0);
  CHECK_THAT(added.output, Catch::Contains("new"));
}

TEST_CASE("check accepts summaries and a NaN that appears is a regression", "[check]") {
  CaseKey key{"d.h5", 0, 0, 0, 64, 8, Mask::kFull, 0, {}, "vmean", "vmean", std::nullopt, "softmax"};
  SummaryRow base{key, "mse", 1, 0.5, 0, 0, 0.5, 0.5, 0.5};
  SummaryRow nan_row = base;
  nan_row.mean = std::nan("");
  CheckReport report = check_regressions({base}, {nan_row}, {});
  CHECK(report.regressions == 1);
  // Deterministic cases (se = 0) get rtol·|mean| of slack: 0.1% worse passes, 1% fails.
  SummaryRow slightly = base, clearly = base;
  slightly.mean = 0.5 * 1.0009;
  clearly.mean = 0.5 * 1.01;
  CHECK(check_regressions({base}, {slightly}, {}).regressions == 0);
  CHECK(check_regressions({base}, {clearly}, {}).regressions == 1);
  const std::string summary = temp_path("summary.csv");
  REQUIRE(run_attnprobe("summarize " + sweep("s.csv", "-e vmean") + " -o " + summary).exit_code == 0);
  CHECK(run_attnprobe("check " + summary + " --baseline " + summary).exit_code == 0);
  CHECK(run_attnprobe("check " + summary + " --baseline " + summary + " --z -1").exit_code == 2);
}

TEST_CASE("check gates case, weight and gradient metrics, topk_recall as larger is better", "[check]") {
  // Only the nine per-trial metrics were known to the CLI's gate: a file with case rows (trial -1), row_tv
  // or grad_q_fro_rel was "unknown metric" even against itself, and a better topk_recall would have been
  // a regression.
  const std::string base = sweep("every-kind.csv",
                                 "-e vmean -e 'performer(M=16)' --layers 0 --metrics "
                                 "fro_rel,case,weights,grad_q_fro_rel,grad_v_fro_rel");
  const auto same = run_attnprobe("check " + base + " --baseline " + base);
  INFO(same.output);
  CHECK(same.exit_code == 0);
  CHECK_THAT(same.output, Catch::Contains("0 regressions"));
  const CheckReport itself = check_regressions(load_gate_input(base, true), load_gate_input(base, false), {});
  for (const char* metric : {"bias_fro_rel", "row_tv", "topk_recall", "grad_q_fro_rel"})
    CHECK(std::count_if(itself.comparisons.begin(), itself.comparisons.end(),
                        [&](const Comparison& c) { return c.metric == metric; }) > 0);
  // topk_recall: lower is the regression, higher the improvement.
  std::vector<SummaryRow> baseline = load_gate_input(base, true);
  baseline.erase(
      std::remove_if(baseline.begin(), baseline.end(), [](const SummaryRow& s) { return s.metric != "topk_recall"; }),
      baseline.end());
  REQUIRE(!baseline.empty());
  for (SummaryRow& s : baseline) s.std = s.stderr_ = 0;
  std::vector<SummaryRow> better = baseline, worse = baseline;
  for (SummaryRow& s : better) s.mean += 0.1;
  for (SummaryRow& s : worse) s.mean -= 0.1;
  const CheckReport up = check_regressions(baseline, better, {}), down = check_regressions(baseline, worse, {});
  CHECK(up.regressions == 0);
  CHECK(up.improvements == static_cast<int>(baseline.size()));
  CHECK(down.regressions == static_cast<int>(baseline.size()));
  CHECK(down.comparisons.front().z > 0);  // z says how much worse
}

TEST_CASE("summarize refuses a trial given twice and pools other seeds", "[check]") {
  // `sweep --lengths 8,8` once wrote each case twice; summarize then counted every trial twice (count 2
  // for one trial, a standard error too small by √2) while check refused the file.
  const std::vector<TrialRow> rows = read_csv(sweep("twice.csv", "-e 'yoso(m=8)' --layers 0 --heads 0")).trials;
  REQUIRE(!rows.empty());
  std::vector<TrialRow> doubled = rows;
  doubled.insert(doubled.end(), rows.begin(), rows.end());
  CHECK_THROWS_WITH(summarize_trials(doubled), Catch::Contains("appears twice"));
  std::vector<TrialRow> reseeded = rows;
  for (TrialRow r : rows) {
    r.seed += 1;  // another run's seed: its trials are other draws, pooled with these
    reseeded.push_back(r);
  }
  const std::vector<SummaryRow> pooled = summarize_trials(reseeded);
  CHECK(pooled.front().count == 2 * summarize_trials(rows).front().count);
}

TEST_CASE("a single run's spread is NaN, not 0, and the gate holds it to rounding", "[check]") {
  // A deterministic estimator runs once: no spread exists to estimate, so std and stderr are NaN (they read 0, which
  // claimed a deterministic case was known to ±0).
  const std::string base = sweep("single.csv", "-e vmean -e 'performer(M=16)' --layers 0 --heads 0");
  const std::vector<SummaryRow> summaries = summarize_trials(read_csv(base).trials);
  int singles = 0;
  for (const SummaryRow& s : summaries) {
    INFO(s.key.spec << " " << s.metric << " count " << s.count);
    if (s.count == 1) {
      ++singles;
      CHECK(std::isnan(s.std));
      CHECK(std::isnan(s.stderr_));
      CHECK(stderr_or_zero(s) == 0);
    } else {
      CHECK(s.stderr_ >= 0);  // performer's 16 trials
    }
  }
  CHECK(singles > 0);  // vmean's metrics
  // Its summary, written and read back, is a valid baseline; an identical rerun passes; vmean moved by 1% fails
  // (a single value is held to atol + rtol·|mean|, rtol 1e-3).
  const std::string summary = temp_path("single-summary.csv");
  REQUIRE(run_attnprobe("summarize " + base + " -o " + summary).exit_code == 0);
  CHECK(read_text(summary).find(",nan,nan,") != std::string::npos);  // count 1, mean, then std and stderr
  const auto same = run_attnprobe("check " + base + " --baseline " + summary);
  INFO(same.output);
  CHECK(same.exit_code == 0);
  std::vector<SummaryRow> moved = summaries;
  for (SummaryRow& s : moved)
    if (s.key.estimator == "vmean" && s.metric == "spec_rel") s.mean *= 1.01;
  const CheckReport report = check_regressions(summaries, moved, CheckOptions{});
  CHECK(report.regressions == 1);
}

TEST_CASE("a selection sweep is its own baseline: its not-applicable NaNs are not a broken run", "[check]") {
  // den_rel, num_rel, eps_cover and pilot are NaN for the oracle top-k (no weights: docs/metrics.md); the gate used
  // to refuse every such baseline (exit 3), so no selection sweep with --metrics selection could be gated at all.
  const std::string dump = write_synth("gate-selection.h5", synth_options(1, 2, 1, 128, 16, {0.2}));
  const std::string run = temp_path("selection-gate.csv");
  REQUIRE(run_attnprobe("sweep " + dump +
                        " -e 'topk(k=16)' -e 'oracle_sample(b=16)' --mask causal --queries last:4 --lengths 128 "
                        "--trials 3 --metrics spec_rel,selection -q -o " +
                        run)
              .exit_code == 0);
  const auto same = run_attnprobe("check " + run + " --baseline " + run);
  INFO(same.output);
  CHECK(same.exit_code == 0);
  // A NaN of a metric that is not a selection one is still refused in a baseline.
  std::vector<SummaryRow> broken = summarize_trials(read_csv(run).trials);
  for (SummaryRow& s : broken)
    if (s.metric == "spec_rel") s.mean = std::nan("");
  CsvContents contents;
  contents.summary = true;
  contents.summaries = broken;
  CHECK_THROWS_WITH(gate_input(contents, "broken", true), Catch::Contains("which no run can be held to"));
}
