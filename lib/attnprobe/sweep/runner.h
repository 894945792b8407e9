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
std::set<TrialId> complete_trials(const std::vector<TrialRow>& rows, const std::vector<Metric>& metrics,
                                  int64_t recall_k = kDefaultRecallK);

struct RunOptions {
  int threads = 0;               ///< 0: all cores
  Device device = Device::kCpu;  ///< where the estimators run (references are float64 on the CPU)
  std::set<TrialId> done;        ///< trials to skip (resume)
  std::function<void(int64_t done, int64_t total)> progress;  ///< called after each slice
  /// Asked before each trial starts, from any pool thread (so it must be thread-safe: read an atomic).
  /// Once it returns true no further trial starts; the trials already running finish, their rows (and
  /// the case rows of settings whose every trial finished) go to the sink, and run_sweep throws
  /// Interrupted. A resume then computes exactly the trials that are missing.
  std::function<bool()> stop_requested;
};

struct RunStats {
  int64_t tasks_run = 0, tasks_skipped = 0, rows = 0;
};

/// Runs the plan; `sink` receives the rows of each slice (possibly none) as soon as they exist.
/// Throws Interrupted (common/error.h) after the last sink call when `options.stop_requested` fired.
/// The other heads a case's view reads with its own for the settings that share a kept set (HeadView::group), as
/// read at the same length as the view: prefix_group's arguments.
struct GroupRead {
  std::vector<const MatrixF*> rows;  ///< each member's query rows (null at the view's own)
  std::vector<const MatrixF*> keys;  ///< each member's keys when it reads another kv head (else null), or empty
  int member = 0;                    ///< the view's own head among them
};

/// The view of a case from `read`, its (layer, head, item) read at the longest length the plan needs: the mask of
/// the case set on `read`, then, where the case has fewer keys or only the last query rows, those cut into
/// `storage`; `group` (when given) becomes its HeadView::group, cut alike. Returns `read` itself when there is
/// nothing to cut.
const HeadView& view_of_case(HeadView& read, const SliceRef& slice, HeadView& storage,
                             const GroupRead* group = nullptr);

RunStats run_sweep(const Dump& dump, const SweepPlan& plan, const RunOptions& options,
                   const std::function<void(const std::vector<TrialRow>&)>& sink);

/// The reference output R* (float64) of a case whose reference is the deterministic estimator
/// `reference`: its float64 path, or its float32 estimate widened where it has none. The runner's
/// step, and what Python's reference() returns.
MatrixD reference_output(const Estimator& reference, const HeadView& view, ThreadPool* pool);

/// The upstream gradient G (n × pv) of the gradient metrics when the dump has no `dy`: iid N(0, 1),
/// row i from the keyed generator (purpose kUpstreamGradient, position (i, 0)), keyed by (seed,
/// layer, head, batch item) only — so every estimator and its reference see the same G, and a
/// shorter length sees the prefix of a longer one's.
MatrixD upstream_gradient(uint64_t seed, const SliceRef& slice, int64_t pv);

/// The value of the `dump` column: the file's base name (so results do not depend on where
/// the file was when it was measured), with what no CSV reader takes back as written escaped: a control
/// character (a newline), a byte that is not UTF-8 as \xNN, and a backslash as \\. Every row stays one
/// line (`wc -l`, grep, the MPI workers' pipe), and pandas reads the label back as written.
std::string dump_label(const std::string& path);

}  // namespace attnprobe
