#pragma once
// A sweep set up as `attnprobe sweep` sets it up (docs/cli.md): the grid planned on the dump, each work
// unit's cost estimated, this process's shard dealt, and the run's options and run.json record filled.
// The one set-up of the CLI's `sweep` and of Python's attnprobe.sweep(), so that a file either writes
// is taken by `merge`, `summarize` and `sweep --resume` alike.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnprobe/io/dump.h"
#include "attnprobe/report/run_info.h"
#include "attnprobe/sweep/plan.h"
#include "attnprobe/sweep/runner.h"
#include "attnprobe/sweep/shard.h"

namespace attnprobe {

/// A sweep's options beside its dump, parsed (the CLI from its text, Python from its arguments).
struct SweepOptions {
  SweepRequest request;                   ///< the grid
  std::optional<ShardSpec> shard;         ///< --shard I/N; none: the whole grid
  int threads = 0;                        ///< --threads (0: all cores)
  std::string device = "cpu";             ///< --device, as given (run.json records it so)
  std::vector<std::string> command_line;  ///< run.json's
};

struct SweepSetup {
  Dump dump;
  SweepPlan plan;              ///< the whole grid, every shard's
  std::vector<int64_t> costs;  ///< each unit's estimated cost (unit_costs), indexed like plan.slices
  ShardPlan part;              ///< this process's units (the whole grid without a shard) and their record
  RunOptions run;              ///< threads and device; progress and stop are the caller's to add
  RunInfo info;                ///< run.json's, with `part`'s plan record
};

/// Plans `options.request` on `dump` (opened by the caller, so that a missing file is reported before
/// the options are parsed, as ever). Throws what plan_sweep throws, and UsageError for an unknown device.
SweepSetup set_up_sweep(Dump dump, const SweepOptions& options);

}  // namespace attnprobe
