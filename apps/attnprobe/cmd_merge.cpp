// `merge`: joins the CSVs of a sharded sweep into the file a single-process run writes. The checks
// and the canonical order are library code (sweep/merge.h); this parses and prints.
#include <fmt/format.h>

#include "attnprobe/sweep/merge.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {

struct MergeOptions {
  std::vector<std::string> inputs;
  std::string output;
  bool overwrite = false;
};

}  // namespace

Action add_merge(CLI::App& app, const Globals& globals) {
  auto o = std::make_shared<MergeOptions>();
  app.add_option("shards", o->inputs,
                 "the shard CSVs of one `sweep --shard I/N`, each with its NAME.csv.run.json beside it")
      ->required();
  app.add_option("-o,--output", o->output, "the merged CSV (its run.json is written beside it)")->required();
  app.add_flag("--overwrite", o->overwrite, "replace the output if it exists");
  app.footer(
      "Example:\n"
      "  for i in 0 1 2; do attnprobe sweep model.h5 -e vmean --lengths 64..1024:x2 --shard $i/3 "
      "-o out/shard-$i.csv; done\n"
      "  attnprobe merge -o out/sweep.csv out/shard-*.csv\n\n"
      "Checks that the inputs are all N shards of one sweep (same attnprobe build, seed, dump, settings, metrics "
      "and grid, per their run.json), each exactly once and finished, and that every row of the plan is present "
      "exactly once with no foreign rows; then writes the rows in the order a single-process sweep writes them, "
      "byte for byte the same file. Any problem is an input error (exit 3) naming the shard and the case.");
  return [o, &globals] {
    RunInfo info;
    info.command_line = globals.argv;
    const MergeResult result = merge_shards(o->inputs, o->output, o->overwrite, info);
    fmt::print(stderr, "merged {} shards ({} units, {} rows) into {}; run info in {}\n", result.shards, result.units,
               result.rows, o->output, result.info_path);
    return 0;
  };
}

}  // namespace attnprobe::cli
