// The sweep's life cycle in-process (sweep/sweep_run.h): output refused or replaced, run.json
// written at the start (finished: null) and the end, and a resumed CSV that ends equal to an
// uninterrupted run's, whatever was cut off.
#include <fstream>
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
  const auto json = nlohmann::json::parse(read_text(temp_path("sub/run.run.json")));
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
    CHECK(nlohmann::json::parse(read_text(temp_path("resume-cut.run.json")))["resumed"] == true);
  }
}
