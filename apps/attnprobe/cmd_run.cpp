// `eval` and `sweep`: the same planner and runner; eval prints a table, sweep writes a long CSV
// (flushed per slice, resumable) and run.json.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/common/output_paths.h"
#include "attnprobe/common/text.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/report/run_info.h"
#include "attnprobe/report/summary.h"
#include "attnprobe/report/table.h"
#include "attnprobe/sweep/budget.h"
#include "attnprobe/sweep/mpi_sweep.h"
#include "attnprobe/sweep/shard.h"
#include "attnprobe/sweep/sweep_run.h"
#include "attnprobe/sweep/sweep_setup.h"
#include "commands.h"
#include "stop_signal.h"

namespace attnprobe::cli {

namespace {

// "; with --device cuda: a, b" where a device backend is built and has causal forms, else "".
std::string causal_on_devices() {
  std::string text;
  for (Device device : kAllDevices)
    if (device != Device::kCpu && device_compiled(device))
      if (const auto names = causal_estimators(device); !names.empty())
        text += fmt::format("; with --device {}: {}", device_name(device), join(names, ", "));
  return text;
}

struct RunCommandOptions {
  std::string dump;
  DumpOptions dump_options;
  std::vector<std::string> estimators;
  std::string layers = "all", heads = "all", batch = "all";
  std::string lengths;  // sweep: list; eval: one value
  std::string samples;
  int trials = 8;
  std::string seed = "0";  // text: CLI11 would wrap -1 into 2^64 - 1; parse_seed() is strict
  int threads = 0;
  std::string max_memory;  // empty: default_memory_limit()
  std::string device = "cpu";
  std::string reference = "auto";
  std::string mask = "auto";
  std::string queries = "all";
  std::string precision = "f32";
  int64_t prefill = -1;  // -1: each case's first evaluated row
  std::string metrics = "all";
  double eps = 0.05;
  int64_t recall_k = 0;  // 0: the K a topk_recall@K name in --metrics gives, else kDefaultRecallK
  std::string output;
  std::string shard;  // sweep: "I/N"
  bool resume = false, overwrite = false, dry_run = false, quiet = false;
};

void add_common_options(CLI::App& cmd, RunCommandOptions& o) {
  cmd.add_option("dump", o.dump,
                 "the dump of queries, keys and values: HDF5, safetensors or .npz (see `attnprobe info --help`)")
      ->required();
  cmd.add_option("-e,--estimator", o.estimators,
                 "estimator spec, repeatable: name or name(key=value,...), e.g. -e vmean -e 'yoso(m=32,tau=8)'; "
                 "`attnprobe list` shows all")
      ->required();
  cmd.add_option("--layers", o.layers, "layer numbers: all (default), a list 0,3 or a range 0..5");
  cmd.add_option("--heads", o.heads, "head indices: all (default), a list or a range");
  cmd.add_option("--batch", o.batch, "batch items: all (default), a list or a range");
  cmd.add_option(
      "--samples", o.samples,
      "values for each estimator's samples knob (m, d, M, S, C, L), e.g. 8..128:x2; omitted: the spec's own. "
      "Estimators without a knob (softmax, vmean, yoso-e) ignore it");
  cmd.add_option("--trials", o.trials, "trials per random setting (deterministic estimators run once)")
      ->capture_default_str()
      ->check(kAtLeastOne);
  cmd.add_option("--seed", o.seed,
                 "seed of the keyed random streams, an integer in 0..18446744073709551615: same seed, same numbers")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "worker threads (0 = all cores); results do not depend on it")
      ->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd.add_option("--max-memory", o.max_memory,
                 "refuse (exit 3) a case whose memory estimate exceeds this, e.g. 8G or 512M; default: the memory "
                 "available now");
  cmd.add_option("--device", o.device,
                 fmt::format("cpu or cuda (CUDA versions: {}; the float64 references stay on the CPU; same seeds "
                             "give the same random draws on both)",
                             device_compiled(Device::kCuda) ? join(estimators_on(Device::kCuda), ", ")
                                                            : std::string("none in this build")))
      ->capture_default_str();
  cmd.add_option("--reference", o.reference,
                 "what to compare against: auto (each estimator's own target, e.g. yoso-e for yoso), softmax, or any "
                 "deterministic spec")
      ->capture_default_str();
  cmd.add_option(
         "--mask", o.mask,
         fmt::format("auto (each layer's causal and window attributes), full (bidirectional), causal (the query "
                     "at position t sees keys 0..t: decoders) or window:W (keys t-W+1..t: sliding-window "
                     "decoders such as Mistral's). The reference is the masked softmax and only estimators "
                     "with a form for the mask run; causal: {}{}; window: {}",
                     join(causal_estimators(), ", "), causal_on_devices(),
                     join(estimators_where_on(Device::kCpu, Mask::kWindow, false), ", ")))
      ->capture_default_str();
  cmd.add_option("--queries", o.queries,
                 fmt::format("the query rows of each case, a list (a sweep axis): all (self-attention, default) or "
                             "last:W, the last W rows of each length against all its keys (W decode steps with the "
                             "rest as their cache; n stays the number of keys), e.g. --queries all,last:16. A last:W "
                             "case draws what its all case draws, so its rows equal the last rows of the all "
                             "estimate. Estimators with a decode form: {}",
                             join(estimators_where_on(Device::kCpu, Mask::kFull, true), ", ")))
      ->capture_default_str();
  cmd.add_option("--precision", o.precision,
                 "what each case is computed in, a list (a sweep axis): f32 (default), bf16 or f16. Below f32 the "
                 "inputs are rounded to it and each estimator rounds the intermediates a GPU kernel would store "
                 "(`attnprobe list NAME` says which); the reference stays float64 of the inputs as stored, "
                 "and a case draws what its f32 case draws. Add --metrics all,precision for the split of the "
                 "error into approximation and rounding (approx_err, round_floor, round_excess, fa_ratio, "
                 "nonfinite_rows), e.g. --precision f32,bf16,f16 --metrics all,precision (docs/precision.md)")
      ->capture_default_str();
  cmd.add_option("--prefill", o.prefill,
                 "P: end the prompt at position P instead of at the first evaluated row of each last:W case; the "
                 "rows P..N-W-1 become decode steps that are not evaluated. For the estimators that compress a "
                 "prompt once (snapkv, expected, streaming(roll=0), tova(mode=prefill)) or replay a cache from it "
                 "(h2o, tova); the others give the same rows. One value; the case id gains ;prefill=P (e.g. "
                 "--queries last:16 --prefill 1024 --lengths 4096: 3056 steps, the last 16 measured)");
  cmd.add_option(
         "--metrics", o.metrics,
         "all (every per-trial metric), or a list of spec,spec_rel,fro,fro_rel,mse,nmse,maxabs,angle,zero_rows; "
         "add 'case' (or bias_fro_rel,var_fro_rel,bias_spec_rel) for the bias/variance split of each "
         "random setting over its trials, written with trial -1; 'weights' (or row_tv,row_kl,topk_recall) to "
         "compare the attention matrix each estimator implies with the exact one; 'selection' (or keys_attended,"
         "keys_scored,density,density_scored,mass_recall,tail_mass,tail_gap,tail_pred,row_kl_rev,kept_overlap,"
         "topk_recall@K,den_rel,num_rel,eps_cover,pilot,reps_attended,kept_overlap_f32,score_ties,cut_ties) for the "
         "keys a selection or sampling estimator reads and the attention it keeps (under --precision bf16/f16: the "
         "keys its rounded scores choose); "
         "'precision' (or approx_err,round_floor,round_excess,fa_ratio, their _spec forms, nonfinite_rows) for "
         "rounding vs approximation under --precision; "
         "grad_q_fro_rel,grad_q_angle,grad_v_fro_rel,grad_pairs for the backward pass (docs/metrics.md)")
      ->capture_default_str();
  cmd.add_option("--eps", o.eps,
                 "the relative error of the metric eps_cover: the fraction of rows with |o_hat - o| <= eps*|o| "
                 "(vattention uses its own eps)")
      ->capture_default_str();
  cmd.add_option("--recall-k", o.recall_k,
                 "K of the metric topk_recall@K (default 10; the CSV's name carries it): the fraction of each row's K "
                 "heaviest visible keys a selection reads. Naming topk_recall@K in --metrics sets it too");
  cmd.add_flag("--dry-run", o.dry_run, "validate and print the size of the grid, run nothing");
  cmd.add_flag("-q,--quiet", o.quiet, "no progress bar");
  add_dump_options(cmd, o.dump_options);
}

uint64_t parse_seed(const std::string& text) {
  uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, seed);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw UsageError(fmt::format("--seed '{}' is not an integer in 0..18446744073709551615 (2^64 - 1)", text));
  return seed;
}

SweepRequest make_request(const RunCommandOptions& o, bool single_length) {
  parse_device(o.device);
  SweepRequest r;
  r.estimators = o.estimators;
  if (!o.samples.empty()) r.samples = parse_int_list(o.samples, "--samples");
  r.layers = o.layers;
  r.heads = o.heads;
  r.batch = o.batch;
  if (!o.lengths.empty()) {
    r.lengths = parse_int_list(o.lengths, single_length ? "--length" : "--lengths");
    if (single_length && r.lengths.size() != 1) throw UsageError("--length takes one value (use sweep for several)");
  }
  r.trials = o.trials;
  r.seed = parse_seed(o.seed);
  r.reference = o.reference;
  r.mask = o.mask;
  r.queries = parse_query_rows_list(o.queries, "--queries");
  if (o.prefill != -1) {
    require_usage(o.prefill >= 0, "--prefill {} is negative: give the position where the prompt ends (P >= 0)",
                  o.prefill);
    for (QueryRows& rows : r.queries) {
      require_usage(rows.kind == QueryRows::Kind::kLast,
                    "--prefill lowers the prompt of decode cases, but --queries has {}: use last:W only",
                    query_rows_text(rows));
      rows.prefill = o.prefill;
    }
  }
  r.precisions = parse_precisions(o.precision);
  r.recall_k = o.recall_k;  // checked by the planner
  r.metrics = parse_metrics(o.metrics, &r.recall_k);
  r.eps = o.eps;
  return r;
}

// The grid's size and memory, checked before anything is read or written: a grid too large to
// write is a usage error, a case that cannot fit an input error; --dry-run prints the figures.
void print_plan(const SweepPlan& plan);

void check_budget(const Dump& dump, const SweepPlan& plan, const RunCommandOptions& o) {
  const double limit = o.max_memory.empty() ? default_memory_limit() : parse_byte_size(o.max_memory, "--max-memory");
  const PlanBudget budget = estimate_budget(dump, plan, o.threads);
  if (o.dry_run) {
    print_plan(plan);
    fmt::print(stderr, "{}", describe_budget(budget, limit));
  }
  require_memory(budget, limit);
}

void print_plan(const SweepPlan& plan) {
  fmt::print(stderr, "plan: {} settings x {} slices = {} trials ({:.0f} metric rows)\n", plan.settings.size(),
             plan.slices.size(), plan.total_tasks(), plan.total_rows());
  for (const EstimatorSetting& s : plan.settings)
    fmt::print(stderr, "  {}  vs {}  ({} trial{})\n", s.canonical, s.reference, s.trials, s.trials == 1 ? "" : "s");
}

bool progress_wanted(const RunCommandOptions& o) { return !o.quiet && isatty(STDERR_FILENO); }

int run_eval(const RunCommandOptions& o) {
  require_separate_files({{"the dump", o.dump}}, {{"-o", o.output}});
  const Dump dump = Dump::open(o.dump, o.dump_options);
  const SweepRequest request = make_request(o, true);
  const SweepPlan plan = plan_sweep(dump, request);
  check_budget(dump, plan, o);
  if (o.dry_run) return 0;
  std::vector<TrialRow> all_rows;
  ProgressBar bar(progress_wanted(o));
  RunOptions options;
  options.threads = o.threads;
  options.device = parse_device(o.device);
  options.progress = [&](int64_t done, int64_t total) { bar.update(done, total); };
  run_sweep(dump, plan, options,
            [&](const std::vector<TrialRow>& rows) { all_rows.insert(all_rows.end(), rows.begin(), rows.end()); });
  bar.finish();
  if (!o.output.empty()) rewrite_trial_csv(o.output, all_rows);

  // One line per setting (and per kind of query rows and precision, when the command asks for several): each
  // metric's mean ± standard error over the slices (summarize --over).
  const bool several_queries = request.queries.size() > 1, several_precisions = request.precisions.size() > 1;
  std::vector<std::vector<std::string>> table = {{"estimator", "reference"}};
  if (several_queries) table[0].push_back("queries");
  if (several_precisions) table[0].push_back("precision");
  std::map<std::string, size_t> column_of;  // a deterministic setting has no case-level metrics: "-"
  for (Metric m : plan.metrics) {
    column_of[metric_name(m, plan.recall_k)] = table[0].size();
    table[0].push_back(metric_name(m, plan.recall_k));
  }
  std::map<std::tuple<std::string, std::string, QueryRows, Precision>, size_t> row_of;
  for (const SummaryRow& s : pool_over_slices(all_rows)) {
    auto [it, added] =
        row_of.emplace(std::tuple(s.key.spec, s.key.reference, s.key.queries, s.key.precision), table.size());
    if (added) {
      table.push_back({s.key.spec, s.key.reference});
      if (several_queries) table.back().push_back(query_rows_text(s.key.queries));
      if (several_precisions) table.back().push_back(precision_name(s.key.precision));
      table.back().resize(table[0].size(), "-");
    }
    table[it->second][column_of.at(s.metric)] =
        s.count > 1 ? fmt::format("{:.4g} ± {:.2g}", s.mean, s.stderr_) : fmt::format("{:.4g}", s.mean);
  }
  const bool one_length =
      !plan.slices.empty() && std::all_of(plan.slices.begin(), plan.slices.end(),
                                          [&](const SliceRef& r) { return r.n == plan.slices.front().n; });
  fmt::print("{} slices of {}, {}; mean ± standard error over slices (each slice's mean over its trials)\n",
             plan.slices.size() / (request.queries.size() * request.precisions.size()), dump_label(o.dump),
             one_length ? fmt::format("n = {}{}", plan.slices.front().n, o.lengths.empty() ? " (full length)" : "")
                        : std::string("n = each batch item's full valid length"));
  fmt::print("{}", format_table(table));
  if (!o.output.empty()) fmt::print(stderr, "wrote {} rows to {}\n", all_rows.size(), o.output);
  return 0;
}

// `--dry-run --shard I/N`: every shard's unit count and estimated cost, then shard I's units.
void print_shards(const SweepPlan& plan, const std::vector<int64_t>& costs, ShardSpec shard) {
  const std::vector<std::vector<size_t>> deal = deal_units(costs, shard.count);
  const double mean = static_cast<double>(std::accumulate(costs.begin(), costs.end(), int64_t{0})) / shard.count;
  fmt::print(stderr, "shards (estimated cost in flops; the deal is largest unit first to the lightest shard):\n");
  for (int i = 0; i < shard.count; ++i) {
    int64_t cost = 0;
    for (size_t u : deal[i]) cost += costs[u];
    fmt::print(stderr, "  shard {}/{}: {} units, cost {:.4g} ({:.1f}% of the mean){}\n", i, shard.count, deal[i].size(),
               static_cast<double>(cost), mean > 0 ? 100.0 * cost / mean : 100.0, i == shard.index ? "  <-" : "");
  }
  fmt::print(stderr, "units of shard {}:\n", shard.text());
  for (size_t u : deal[shard.index]) {
    const SliceRef& s = plan.slices[u];
    fmt::print(stderr, "  #{} layer={} head={} batch={} n={}  cost {:.4g}\n", u, s.layer, s.head, s.batch, s.n,
               static_cast<double>(costs[u]));
  }
}

int run_sweep_command(const RunCommandOptions& o, const Globals& globals) {
  const std::optional<MpiLaunch> launch = mpi_launch_from_environment();
  if (const std::string why = mpi_refusal(launch, mpi_compiled()); !why.empty()) throw UsageError(why);
  const bool under_mpi = launch && launch->size > 1;
  if (under_mpi && !o.shard.empty())
    throw UsageError("--shard and mpirun exclude each other: under mpirun the ranks share the whole grid");
  const std::optional<ShardSpec> shard = o.shard.empty() ? std::nullopt : std::optional(ShardSpec::parse(o.shard));

  Dump dump = Dump::open(o.dump, o.dump_options);
  SweepSetup setup =
      set_up_sweep(std::move(dump), SweepOptions{make_request(o, false), shard, o.threads, o.device, globals.argv});
  check_budget(setup.dump, setup.plan, o);  // under --dry-run it prints the plan and what it needs
  if (o.dry_run) {
    if (shard) print_shards(setup.plan, setup.costs, *shard);
    return 0;
  }
  if (o.resume && o.overwrite) throw UsageError("--resume and --overwrite exclude each other");
  const OutputMode mode = o.resume ? OutputMode::kResume : o.overwrite ? OutputMode::kOverwrite : OutputMode::kCreate;
  RunOptions& options = setup.run;

  if (under_mpi) {
    ProgressBar bar(progress_wanted(o) && launch->rank == 0);
    options.progress = [&](int64_t done, int64_t total) { bar.update(done, total); };
    const MpiSweepResult result =
        run_mpi_sweep(setup.dump, setup.plan, setup.costs, o.output, mode, options, setup.info);
    bar.finish();
    if (result.rank == 0)
      fmt::print(stderr, "wrote {} rows ({} trials, {} ranks) to {}{}; run info in {}\n", result.stats.rows,
                 result.stats.tasks_run, launch->size, o.output,
                 result.stats.tasks_skipped ? fmt::format(", kept {} finished trials", result.stats.tasks_skipped) : "",
                 run_info_path(o.output));
    return 0;
  }

  const size_t units = setup.part.plan.slices.size();
  ProgressBar bar(progress_wanted(o));
  options.progress = [&](int64_t done, int64_t total) { bar.update(done, total); };
  const StopOnSignal stop_on_signal;
  options.stop_requested = &StopOnSignal::requested;
  SweepRun run(setup.dump, std::move(setup.part.plan), o.output, mode, options, setup.info);
  RunStats stats;
  try {
    stats = run.run();
  } catch (const Interrupted& e) {
    bar.finish();
    throw Interrupted(fmt::format(
        "{}{}. The rows of every finished trial are in {}: rerun the same command with --resume to complete it.",
        e.what(),
        run.kept_rows()
            ? fmt::format(" (besides {} rows of finished trials kept from the earlier run)", run.kept_rows())
            : "",
        o.output));
  }
  bar.finish();
  fmt::print(stderr, "wrote {} rows ({} trials{}) to {}{}; run info in {}\n", stats.rows, stats.tasks_run,
             shard ? fmt::format(", shard {}: {} units", shard->text(), units) : "", o.output,
             stats.tasks_skipped
                 ? fmt::format(", kept {} rows of {} finished trials", run.kept_rows(), stats.tasks_skipped)
                 : "",
             run.info_path());
  return 0;
}

}  // namespace

Action add_eval(CLI::App& app, const Globals& globals) {
  auto o = std::make_shared<RunCommandOptions>();
  add_common_options(app, *o);
  // --lengths too, so a command line moves between eval and sweep unchanged (with one value).
  app.add_option("--length,--lengths", o->lengths,
                 "tokens to use (a prefix of each batch item), one value; default: the full valid length");
  app.add_option("-o,--output", o->output, "also write the trial rows to this CSV (overwritten)");
  app.footer(
      "Example:\n  attnprobe eval data/synth-demo.h5 -e vmean -e softmax --layers 0 --length 128\n\n"
      "Prints, per estimator setting, each metric's mean ± standard error over the chosen slices and trials.");
  return [o] { return run_eval(*o); };
}

Action add_sweep(CLI::App& app, const Globals& globals) {
  auto o = std::make_shared<RunCommandOptions>();
  add_common_options(app, *o);
  app.add_option("--lengths,--length", o->lengths,
                 "sequence lengths, one or a list, e.g. 64..1024:x2 (each is a prefix of the sequence); default: the "
                 "full valid length");
  app.add_option("-o,--output", o->output, "the long CSV to write (one row per case, trial and metric)")->required();
  app.add_flag("--resume", o->resume, "continue an interrupted sweep into the same CSV: finished trials are skipped");
  app.add_flag("--overwrite", o->overwrite, "replace the CSV if it exists");
  app.add_option("--shard", o->shard,
                 "I/N: run only shard I (0-based) of N; the grid's units (one slice at one length with all its "
                 "settings and trials) are dealt by estimated cost, the same on every machine. Each shard writes "
                 "its own -o; `attnprobe merge` joins them. With --dry-run: print every shard's cost and shard I's "
                 "units");
  app.footer(
      "Example:\n  attnprobe sweep data/synth-demo.h5 -e vmean -e softmax --lengths 64..256:x2 -o out/sweep.csv\n"
      "  attnprobe summarize out/sweep.csv --table\n\n"
      "Rows are flushed per slice; after an interruption rerun the same command with --resume. Beside the CSV, "
      "NAME.csv.run.json records the command, version, git hash, threads, seed and times. The same --seed gives the "
      "same numbers for any --threads and any subset of the grid.\n\n"
      "Beyond one machine:\n"
      "  attnprobe sweep model.h5 -e vmean --lengths 64..4096:x2 --shard 0/4 -o out/shard-0.csv   # ... 1/4, 2/4, 3/4\n"
      "  attnprobe merge -o out/sweep.csv out/shard-*.csv\n"
      "  mpirun -n 4 attnprobe sweep model.h5 -e vmean --lengths 64..4096:x2 --threads 1 -o out/sweep.csv");
  return [o, &globals] { return run_sweep_command(*o, globals); };
}

}  // namespace attnprobe::cli
