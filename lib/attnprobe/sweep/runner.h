#pragma once
// The trial runner: for each slice of a plan, read it once, compute each needed reference once
// (float64), run every (setting, trial) task on the thread pool, compute metrics, and hand the
// slice's rows to the sink in plan order — so the output is identical for any thread count.
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/records/record.h"
#include "attnprobe/sweep/plan.h"

namespace attnprobe {

/// The trials whose rows hold every metric in `metrics`.
std::set<TrialId> complete_trials(const std::vector<TrialRow>& rows, const std::vector<Metric>& metrics);

struct RunOptions {
  int threads = 0;               ///< 0: all cores
  Device device = Device::kCpu;  ///< where the estimators run (references are float64 on the CPU)
  std::set<TrialId> done;        ///< trials to skip (resume)
  std::function<void(int64_t done, int64_t total)> progress;  ///< called after each slice
};

struct RunStats {
  int64_t tasks_run = 0, tasks_skipped = 0, rows = 0;
};

/// Runs the plan; `sink` receives the rows of each slice (possibly none) as soon as they exist.
RunStats run_sweep(const Dump& dump, const SweepPlan& plan, const RunOptions& options,
                   const std::function<void(const std::vector<TrialRow>&)>& sink);

/// The value of the `dump` column: the file's base name (so results do not depend on where
/// the file was when it was measured).
std::string dump_label(const std::string& path);

}  // namespace attnprobe
