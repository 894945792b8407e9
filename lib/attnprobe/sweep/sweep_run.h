#pragma once
// One sweep with its output files, from start to end: the trial CSV (append-only, flushed per
// slice) and NAME.run.json beside it (docs/csv.md). The CLI's `sweep` only parses options and prints
// what this returns; tests drive it in-process.
//
// One writer per CSV: the run holds an advisory lock (flock) on the CSV from construction to
// destruction, so a second sweep into the same file (a `--resume` started while the first runs)
// is refused, naming the first's process id (/proc/locks, else run.json). A resumed CSV must belong
// to the same grid: run.json's seed and plan fingerprint and the rows' seed and case columns are checked.
#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "attnprobe/records/csv.h"
#include "attnprobe/report/run_info.h"
#include "attnprobe/sweep/runner.h"

namespace attnprobe {

/// What to do when the output CSV already exists.
enum class OutputMode {
  kCreate,     ///< refuse an existing non-empty file (UsageError naming --resume and --overwrite)
  kResume,     ///< keep its finished trials and compute the rest
  kOverwrite,  ///< replace it
};

class SweepRun {
 public:
  /// Checks the output path (InputError naming it: a folder that cannot be created, a directory, a
  /// device), locks the CSV (InputError "in use by process N"), reconciles a resumed CSV (only whole
  /// trials are kept: rows of a trial cut off mid-way, and a final partial line, are dropped and
  /// recomputed; UsageError when the earlier run had another seed or grid) and writes run.json with
  /// `finished: null`, so an interrupted run is recognisable as one. A CSV this constructor created
  /// is removed again when it fails. `info` carries the command line, dump, device, threads and seed.
  SweepRun(const Dump& dump, SweepPlan plan, std::string csv_path, OutputMode mode, RunOptions options, RunInfo info);
  ~SweepRun();
  SweepRun(const SweepRun&) = delete;
  SweepRun& operator=(const SweepRun&) = delete;

  /// Runs every unfinished trial, appending each slice's rows as they are produced, and records
  /// the end time and row count in run.json.
  RunStats run();

  // For an executor other than run(), on the process that owns the output (the MPI runner,
  // mpi_sweep.h): the plan, the trials a resumed file already holds, and the writes.
  const SweepPlan& plan() const { return plan_; }
  const std::set<TrialId>& done() const { return options_.done; }
  /// Appends one block of rows already formatted as CSV lines (one write, flushed); rewrites run.json
  /// with the count so far at most every 10 s, so a long run shows how far it got.
  void append(const std::string& lines, int64_t rows);
  /// Ends an append() run: rewrites the CSV atomically in the canonical order of the info's plan
  /// record (merge.h; rows of other plans kept in a resumed file go last) and records the end time.
  void finish_canonical();

  int64_t kept_rows() const { return kept_rows_; }  ///< rows of finished trials kept from an earlier run
  const std::string& csv_path() const { return csv_path_; }
  const std::string& info_path() const { return info_path_; }

 private:
  void lock_output();
  void check_resumable(const std::vector<TrialRow>& rows) const;
  void replace_csv(const std::vector<TrialRow>& rows);

  const Dump& dump_;
  SweepPlan plan_;
  std::string csv_path_, info_path_;
  RunOptions options_;
  RunInfo info_;
  int64_t kept_rows_ = 0;
  int lock_fd_ = -1;                        ///< open on the CSV, flock'ed exclusively while this run lives
  std::unique_ptr<TrialCsvWriter> writer_;  ///< append()'s
  std::chrono::steady_clock::time_point info_written_;
};

}  // namespace attnprobe
