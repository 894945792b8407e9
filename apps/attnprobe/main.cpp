// attnprobe: how far is an efficient attention estimator from the real thing, on your model?
#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "attnprobe/common/allocator.h"
#include "attnprobe/common/error.h"
#include "attnprobe/version.h"
#include "commands.h"

int main(int argc, char** argv) {
  using namespace attnprobe;
  keep_freed_memory();
  // A reader that closes the pipe (`attnprobe list | head`) makes a write fail with EPIPE, which the
  // checked writes report as exit 3 (docs/cli.md), instead of a death by SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "attnprobe measures how far randomized estimators of softmax attention (YOSO, Skeinformer, Performer, RA, "
      "LARA, Nystromformer, ...) are from exact attention on the queries, keys and values of your own model.\n\n"
      "Typical session:\n"
      "  attnprobe info model.h5                       # what is in the dump, and is it sound?\n"
      "  attnprobe list                                # the estimators and their parameters\n"
      "  attnprobe sweep model.h5 -e vmean -e softmax --lengths 64..512:x2 -o out/sweep.csv\n"
      "  attnprobe summarize out/sweep.csv --table     # mean, stderr, ... per case\n"
      "  attnprobe check out/sweep.csv --baseline base.csv   # did anything get worse?\n"
      "  attnprobe report out/sweep.csv -o out/report.html  # one page to read it all in a browser\n",
      "attnprobe"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("attnprobe ") + kVersion);
  app.footer(
      "Exit codes: 0 ok, 1 regression found by check, 2 usage error, 3 input error, 4 internal error, 130 a sweep "
      "stopped by Ctrl-C or SIGTERM (rerun it with --resume).");

  cli::Globals globals;
  for (int i = 0; i < argc; ++i) globals.argv.emplace_back(argv[i]);
  std::vector<std::pair<CLI::App*, cli::Action>> commands;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands.emplace_back(sub, adder(*sub));
  };
  add("info", "list a dump's layers, heads, lengths, dims, dtype, scale, and check its values",
      [](CLI::App& a) { return cli::add_info(a); });
  add("list", "list every registered estimator with its parameters, defaults and target",
      [](CLI::App& a) { return cli::add_list(a); });
  add("eval", "run estimators on chosen slices at one length and print their errors",
      [&](CLI::App& a) { return cli::add_eval(a, globals); });
  add("sweep", "run the grid lengths x samples x estimators x slices x trials into a long CSV",
      [&](CLI::App& a) { return cli::add_sweep(a, globals); });
  add("summarize", "aggregate trial rows into mean/std/stderr/median/min/max per case",
      [](CLI::App& a) { return cli::add_summarize(a); });
  add("check", "regression gate: exit 1 if a case got worse than the baseline beyond a statistical tolerance",
      [](CLI::App& a) { return cli::add_check(a); });
  add("report",
      "one self-contained HTML page of a run: errors by length, samples and head, cost fronts, bias/variance, "
      "and the gate against a baseline",
      [&](CLI::App& a) { return cli::add_report(a, globals); });
  add("merge", "join the CSVs of a sharded sweep (sweep --shard I/N) into one, in the canonical row order",
      [&](CLI::App& a) { return cli::add_merge(a, globals); });
  add("diagnose", "per slice and length: attention entropy, support, stable rank, distance, ... as a CSV",
      [](CLI::App& a) { return cli::add_diagnose(a); });
  add("synth", "write a seeded synthetic dump with controlled attention sharpness",
      [](CLI::App& a) { return cli::add_synth(a); });
  add("bench", "time exact attention and estimators per call (with the sgemm floor)",
      [](CLI::App& a) { return cli::add_bench(a); });

  std::vector<std::string> names;
  for (auto& [sub, action] : commands) names.push_back(sub->get_name());
  if (argc > 1 && argv[1][0] != '-' && std::find(names.begin(), names.end(), argv[1]) == names.end()) {
    fmt::print(stderr, "attnprobe: unknown command '{}'. Commands: {}. See attnprobe --help.\n", argv[1],
               fmt::join(names, ", "));
    return exit_code::kUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 names an unknown option of a command but not the one that was meant.
    std::string hints;
    if (dynamic_cast<const CLI::ExtrasError*>(&e))
      for (const CLI::App* sub : app.get_subcommands()) hints += cli::suggest_options(*sub);
    if (!hints.empty()) {
      fmt::print(stderr, "{}.{}\nRun with --help for more information.\n", e.what(), hints);
      return exit_code::kUsage;
    }
    return app.exit(e) == 0 ? exit_code::kOk : exit_code::kUsage;
  }
  try {
    for (auto& [sub, action] : commands)
      if (sub->parsed()) {
        const int code = action();
        // summarize, diagnose, list, info, eval and check print their results: a write that failed
        // (a full disk, a closed descriptor) is an input error, never a success with the output cut.
        if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
          fmt::print(stderr, "attnprobe: error: writing standard output failed: {}\n", std::strerror(errno));
          return exit_code::kInput;
        }
        return code;
      }
  } catch (const Interrupted& e) {
    fmt::print(stderr, "attnprobe: {}\n", e.what());
    return exit_code::kInterrupted;
  } catch (const UsageError& e) {
    fmt::print(stderr, "attnprobe: usage error: {}\n", e.what());
    return exit_code::kUsage;
  } catch (const InputError& e) {
    fmt::print(stderr, "attnprobe: error: {}\n", e.what());
    return exit_code::kInput;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave cannot be created, inspected or replaced: input, not a bug.
    fmt::print(stderr, "attnprobe: error: {}\n", e.what());
    return exit_code::kInput;
  } catch (const std::bad_alloc&) {
    // The memory estimate (sweep/budget.h) is an estimate: what it missed is a resource limit.
    fmt::print(stderr,
               "attnprobe: error: out of memory. Use shorter --lengths, fewer samples or --threads, or a machine "
               "with more memory.\n");
    return exit_code::kInput;
  } catch (const std::system_error& e) {
    // The system refused a write or a resource (fmt::print on a full disk or a closed stdout): not a bug.
    fmt::print(stderr, "attnprobe: error: {}\n", e.what());
    return exit_code::kInput;
  } catch (const std::exception& e) {
    fmt::print(stderr,
               "attnprobe: internal error: {}\nThis is a bug in attnprobe; please report it with the command line.\n",
               e.what());
    return exit_code::kInternal;
  }
  return exit_code::kInternal;
}
