#pragma once
// run.json: what produced a CSV (docs/csv.md, "run.json"): command line, version, git hash, build type,
// device, threads, seed, start and end time. Written when a run starts (finished = null) and
// again when it ends, so an interrupted run is recognisable as such.
#include <string>
#include <vector>

namespace attnprobe {

struct RunInfo {
  std::vector<std::string> command_line;
  std::string dump;
  std::string device = "cpu";
  int threads = 0;
  unsigned long long seed = 0;
  bool resumed = false;
  std::string plan;      ///< fingerprint of the grid (seed, settings, slices, metrics): what --resume must match
  long long pid = 0;     ///< the process writing the CSV (named when a second writer is refused)
  std::string started;   ///< ISO 8601 UTC
  std::string finished;  ///< "" while running
  long long rows_written = 0;
};

std::string iso_time_now();
std::string attnprobe_version();  ///< "0.1.0 (git abc123, Release, openblas)"
/// The run.json path that goes with a CSV: "dir/name.csv" → "dir/name.run.json".
std::string run_info_path(const std::string& csv_path);
void write_run_info(const std::string& path, const RunInfo& info);

}  // namespace attnprobe
