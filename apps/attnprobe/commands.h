#pragma once
// One function per subcommand: `add_*` declares its options on the CLI11 app and returns the
// action to run after parsing. main.cpp maps exceptions to the exit codes of docs/cli.md.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "attnprobe/io/dump.h"

namespace attnprobe::cli {

using Action = std::function<int()>;

struct Globals {
  std::vector<std::string> argv;  ///< for run.json
};

Action add_info(CLI::App& app);
Action add_list(CLI::App& app);
Action add_eval(CLI::App& app, const Globals& globals);
Action add_sweep(CLI::App& app, const Globals& globals);
Action add_summarize(CLI::App& app);
Action add_synth(CLI::App& app);
Action add_bench(CLI::App& app);
Action add_check(CLI::App& app);
Action add_report(CLI::App& app, const Globals& globals);
Action add_merge(CLI::App& app, const Globals& globals);
Action add_diagnose(CLI::App& app);

/// A whole number ≥ 1 (CLI::PositiveNumber's message named a 300-digit bound: DBL_MAX).
extern const CLI::Validator kAtLeastOne;

/// " Did you mean '--trials' (for '--trails')?" for each option of `command` left unparsed (CLI::ExtrasError)
/// that is near one of its options; "" if none is.
std::string suggest_options(const CLI::App& command);

/// --q-path/--k-path/--v-path/--layout/--num-heads, shared by every command that reads a dump.
void add_dump_options(CLI::App& cmd, DumpOptions& options);

}  // namespace attnprobe::cli
