// The sweep's life cycle in-process (sweep/sweep_run.h): output refused or replaced, run.json
// written at the start (finished: null) and the end, and a resumed CSV that ends equal to an
// uninterrupted run's, whatever was cut off or wherever a stop was asked for.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "attnprobe/common/error.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/sweep_run.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

SweepPlan small_plan(const Dump& dump) {
  SweepRequest request;
  request.estimators = {"vmean", "yoso(m=4)", "performer(M=8)"};
  request.lengths = {16, 32};
  request.trials = 3;
  request.seed = 5;
  return plan_sweep(dump, request);
}

RunStats run_into(const Dump& dump, const std::string& csv, OutputMode mode) {
  RunInfo info;
  info.dump = dump.path();
  info.seed = 5;
  SweepRun run(dump, small_plan(dump), csv, mode, RunOptions{.threads = 2}, info);
  return run.run();
}

}  // namespace

TEST_CASE("a sweep run writes its CSV and run.json, and refuses to clobber", "[sweep]") {
  const Dump dump = Dump::open(write_synth("run.h5", synth_options(1, 2, 1, 32, 8)));
  const std::string csv = temp_path("sub/run.csv");  // the folder is created
  const RunStats stats = run_into(dump, csv, OutputMode::kCreate);
  // 2 heads × 2 lengths × (vmean 1 + yoso 3 + performer 3 trials) = 28 trials, 9 metrics each.
  CHECK(stats.tasks_run == 28);
  CHECK(read_csv(csv).trials.size() == 28 * 9);
  const auto json = nlohmann::json::parse(read_text(temp_path("sub/run.csv.run.json")));
  CHECK(json["seed"] == 5);
  CHECK(json["rows_written"] == 28 * 9);
  CHECK(json["finished"].is_string());
  CHECK(json["resumed"] == false);

  CHECK_THROWS_AS(run_into(dump, csv, OutputMode::kCreate), UsageError);
  CHECK(run_into(dump, csv, OutputMode::kOverwrite).tasks_run == 28);
  CHECK(read_csv(csv).trials.size() == 28 * 9);
}

TEST_CASE("a resumed sweep equals an uninterrupted one, wherever it was cut", "[sweep]") {
  const Dump dump = Dump::open(write_synth("resume.h5", synth_options(1, 2, 1, 32, 8)));
  const std::string whole = temp_path("whole.csv");
  run_into(dump, whole, OutputMode::kCreate);
  const std::string expected = read_text(whole);
  // Cut inside a row, at a row boundary in the middle of a trial, and after the header only.
  for (size_t cut : {expected.size() / 3 + 7, expected.find('\n', expected.size() / 2) + 1, expected.find('\n') + 1}) {
    const std::string partial = temp_path("resume-cut.csv");
    std::ofstream(partial, std::ios::binary) << expected.substr(0, cut);
    RunInfo info;
    info.seed = 5;
    SweepRun run(dump, small_plan(dump), partial, OutputMode::kResume, RunOptions{.threads = 1}, info);
    const RunStats stats = run.run();
    INFO("cut at byte " << cut << " of " << expected.size());
    CHECK(stats.tasks_skipped + stats.tasks_run == 28);
    CHECK(run.kept_rows() % 9 == 0);  // only whole trials are kept
    // Rows of one slice come out in plan order, so the resumed file holds the same rows; compare
    // as sets of lines (kept trials stay where they were, recomputed ones are appended).
    auto lines = [](const std::string& text) {
      std::multiset<std::string> out;
      size_t pos = 0;
      while (pos < text.size()) {
        const size_t end = text.find('\n', pos);
        out.insert(text.substr(pos, end - pos));
        pos = end + 1;
      }
      return out;
    };
    CHECK(lines(read_text(partial)) == lines(expected));
    CHECK(nlohmann::json::parse(read_text(temp_path("resume-cut.csv.run.json")))["resumed"] == true);
  }
}

TEST_CASE("a sweep stopped on request keeps every finished trial, and a resume completes it", "[sweep]") {
  // The stop fires after `allowed` trials have started (RunOptions::stop_requested is asked once per
  // trial): before the first, inside the first slice, inside a later slice with a setting's trials cut
  // (so its case row must wait for the resume), and never. With case metrics, so the case rows'
  // accumulators are rebuilt on resume from the kept trials.
  const Dump dump = Dump::open(write_synth("stop.h5", synth_options(1, 2, 1, 32, 8)));
  auto plan = [&] {
    SweepRequest request;
    request.estimators = {"vmean", "yoso(m=4)", "performer(M=8)"};
    request.lengths = {16, 32};
    request.trials = 3;
    request.seed = 5;
    request.metrics = parse_metrics("mse,spec_rel,bias_fro_rel");
    return plan_sweep(dump, request);
  };
  RunInfo info;
  info.seed = 5;
  const std::string whole = temp_path("stop-whole.csv");
  SweepRun(dump, plan(), whole, OutputMode::kCreate, RunOptions{.threads = 2}, info).run();
  const std::string expected = read_text(whole);
  auto lines = [](const std::string& text) {
    std::multiset<std::string> out;
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = text.find('\n', pos);
      out.insert(text.substr(pos, end - pos));
      pos = end + 1;
    }
    return out;
  };
  // 4 slices × (vmean 1 + yoso 3 + performer 3) = 28 trials × 2 rows, plus 2 case rows per slice.
  REQUIRE(lines(expected).size() == 1 + 28 * 2 + 4 * 2);

  for (int threads : {1, 2})
    for (int allowed : {0, 3, 12, 1000}) {
      INFO("threads " << threads << ", stop after " << allowed << " trials started");
      const std::string cut = temp_path("stop-cut.csv");
      std::filesystem::remove(cut);
      std::atomic<int> asked{0};
      RunOptions options{.threads = threads};
      options.stop_requested = [&] { return asked.fetch_add(1) >= allowed; };
      if (allowed < 28) {
        CHECK_THROWS_AS(SweepRun(dump, plan(), cut, OutputMode::kCreate, options, info).run(), Interrupted);
        const auto json = nlohmann::json::parse(read_text(temp_path("stop-cut.csv.run.json")));
        CHECK(json["finished"].is_null());
        CHECK(json["interrupted"].is_string());
        const CsvContents partial = read_csv(cut);
        CHECK(json["rows_written"] == partial.trials.size());
        // Only whole trials: 2 rows each, and no case row of a setting with a trial missing.
        std::map<std::tuple<std::string, int64_t, int64_t>, int> per_trial;
        for (const TrialRow& r : partial.trials) ++per_trial[{r.key.spec, r.key.n.value(), r.trial}];
        for (const auto& [id, count] : per_trial) CHECK(count == (std::get<2>(id) == kCaseTrial ? 1 : 2));
        // One thread: the stop is asked before each slice and each trial. 3: slice 1's check, then
        // vmean t0 and yoso t0 run (4 rows). 12: slice 1 whole (8 asks, 7 trials: 14 rows + the case
        // rows of yoso and performer), then slice 2's check and 3 trials (6 rows; yoso's cut: no case row).
        const std::map<int, size_t> rows_one_thread = {{0, 0}, {3, 4}, {12, 22}};
        if (threads == 1) CHECK(partial.trials.size() == rows_one_thread.at(allowed));
      } else {
        SweepRun(dump, plan(), cut, OutputMode::kCreate, options, info).run();
      }
      SweepRun resumed(dump, plan(), cut, OutputMode::kResume, RunOptions{.threads = threads}, info);
      resumed.run();
      CHECK(lines(read_text(cut)) == lines(expected));
    }
}

TEST_CASE("a plan's row count is what its run writes, case rows included", "[sweep]") {
  // --dry-run and the grid limit read SweepPlan::total_rows; it counted case metrics once per trial.
  const Dump dump = Dump::open(write_synth("rows.h5", synth_options(1, 2, 1, 32, 8)));
  SweepRequest request;
  request.estimators = {"vmean", "performer(M=8)"};
  request.lengths = {16, 32};
  request.trials = 3;
  request.metrics = parse_metrics("all,case");
  const SweepPlan plan = plan_sweep(dump, request);
  int64_t written = 0;
  run_sweep(dump, plan, RunOptions{.threads = 1}, [&](const std::vector<TrialRow>& rows) { written += rows.size(); });
  // 4 slices × (vmean 1 + performer 3 trials) × 9 metrics + 4 slices × performer's 3 case metrics.
  CHECK(written == 4 * 4 * 9 + 4 * 3);
  CHECK(plan.total_rows() == static_cast<double>(written));
}
