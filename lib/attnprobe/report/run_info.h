#pragma once
// run.json: what produced a CSV (docs/csv.md, "run.json"): command line, version, git hash, build type,
// device, threads, seed, start and end time, and the plan with the shard (what `merge` checks). Written when a run
// starts (finished = null) and again when it ends, so an interrupted run is recognisable as such.
#include <optional>
#include <string>
#include <vector>

#include "attnprobe/common/rounding.h"
#include "attnprobe/view/mask.h"

namespace attnprobe {

/// One estimator setting of a sweep's plan, as run.json records it (its `plan.settings`).
struct SettingRecord {
  std::string estimator, spec;
  std::optional<long long> samples;  ///< the samples knob's value; none without a knob
  std::string reference;
  int trials = 1;
  bool operator==(const SettingRecord&) const = default;
};

/// One work unit (a slice at one length, with every setting and trial of it) and its place in the
/// plan's canonical order, the order a single-process sweep writes.
struct UnitRecord {
  long long index = 0;  ///< position among all units of the plan
  int layer = 0, head = 0, batch = 0;
  long long n = 0, p = 0;                 ///< length and head dim (the `n` and `p` columns)
  Mask mask = Mask::kFull;                ///< the `mask` column (with `window`)
  long long window = 0;                   ///< W of window:W
  QueryRows queries;                      ///< the `queries` column
  Precision precision = Precision::kF32;  ///< the `precision` column
  bool operator==(const UnitRecord&) const = default;
};

/// What a sweep planned and which part of it this run did: enough for `merge` to check that files
/// are shards of one sweep and to list every row each must hold (docs/csv.md, run.json `plan`).
struct PlanRecord {
  std::string dump;  ///< the `dump` column (the file's base name)
  unsigned long long seed = 0;
  std::vector<SettingRecord> settings;  ///< in plan order
  std::vector<std::string> metrics;     ///< in the selected order
  double eps = 0.05;                    ///< --eps, the ε of eps_cover (files without it: 0.05)
  long long units_total = 0;            ///< units of the whole plan, all shards
  std::string fingerprint;              ///< 16 hex digits over all of the above and every unit of the plan
  int shard_index = 0, shard_count = 1;
  std::vector<UnitRecord> units;  ///< the units this run was dealt, in canonical order
};

struct RunInfo {
  std::vector<std::string> command_line;
  std::string dump;
  /// The dump's contents and how they were read (io/dump.h, Dump::fingerprint): `--resume` refuses a dump
  /// that changed under the same name. "" in files of older versions.
  std::string dump_fingerprint;
  std::string device = "cpu";
  int threads = 0;
  unsigned long long seed = 0;
  bool resumed = false;
  long long pid = 0;        ///< the process writing the CSV (named when a second writer is refused)
  std::string started;      ///< ISO 8601 UTC
  std::string finished;     ///< "" while running
  std::string interrupted;  ///< when the run was stopped on request (Ctrl-C, SIGTERM); "" otherwise
  long long rows_written = 0;
  std::optional<PlanRecord> plan;        ///< the sweep's plan and shard; none for files of older versions
  std::vector<std::string> merged_from;  ///< `merge`: the shard CSVs, as given
  std::string version, git_hash;         ///< read_run_info only: the writer's (write_run_info writes this build's)
};

/// run.json's record of a sweep about to run: its command line, dump, threads (`threads` as --threads
/// gives it: 0 is every core), device and seed. set_up_sweep (sweep/sweep_setup.h) fills it for the CLI
/// and the Python sweep alike and adds the plan record.
RunInfo sweep_run_info(std::vector<std::string> command_line, std::string dump, int threads, std::string device,
                       unsigned long long seed);

std::string iso_time_now();
std::string attnprobe_version();  ///< "0.1.0 (git abc123, Release, openblas)"
/// The run.json path that goes with a CSV: the whole file name + ".run.json" ("dir/name.csv" →
/// "dir/name.csv.run.json"), so that two outputs that differ only in their extension never share one.
std::string run_info_path(const std::string& csv_path);
/// The run.json to read for a CSV: run_info_path's, or where only it is absent and the CSV ends in
/// ".csv", the name older versions wrote ("dir/name.run.json").
std::string existing_run_info_path(const std::string& csv_path);
void write_run_info(const std::string& path, const RunInfo& info);
/// Reads a run.json back (unknown fields are ignored). Throws InputError naming the file when it is
/// missing or not such a JSON object.
RunInfo read_run_info(const std::string& path);

}  // namespace attnprobe
