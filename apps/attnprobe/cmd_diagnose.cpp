// `diagnose`: head diagnostics per slice and length as a long CSV (and `info --diagnostics` prints
// them per head). The numbers come from metrics/head_diagnostics.h, the walk over the slices from
// diagnose/slice_diagnostics.h.
#include <fmt/format.h>
#include <unistd.h>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/output_paths.h"
#include "attnprobe/common/text.h"
#include "attnprobe/diagnose/slice_diagnostics.h"
#include "attnprobe/metrics/head_diagnostics.h"
#include "attnprobe/records/schema.h"
#include "attnprobe/report/table.h"
#include "attnprobe/sweep/plan.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {

struct DiagnoseOptions {
  std::string dump, output, lengths;
  std::string layers = "all", heads = "all", batch = "all";
  std::string mask = "full", queries = "all";
  int threads = 0;
  bool quiet = false;
  DumpOptions dump_options;
};

int run_diagnose(const DiagnoseOptions& o) {
  require_separate_files({{"the dump", o.dump}}, {{"-o", o.output == "-" ? "" : o.output}});
  const Dump dump = Dump::open(o.dump, o.dump_options);
  SweepRequest request;  // the planner validates the selection; the estimator is a placeholder
  request.estimators = {"softmax"};
  request.layers = o.layers, request.heads = o.heads, request.batch = o.batch;
  if (!o.lengths.empty()) request.lengths = parse_int_list(o.lengths, "--lengths");
  request.mask = o.mask;
  request.queries = parse_query_rows_list(o.queries, "--queries");
  const SweepPlan plan = plan_sweep(dump, request);
  const std::vector<DiagnosticRow> rows = diagnose_slices(dump, plan.slices, o.threads, [&](int64_t done) {
    if (!o.quiet && isatty(STDERR_FILENO)) fmt::print(stderr, "\rdiagnosed {}/{} slices", done, plan.slices.size());
  });
  if (!o.quiet && isatty(STDERR_FILENO)) fmt::print(stderr, "\n");
  const std::string text = csv_text(diagnostic_columns(), rows);
  if (o.output.empty() || o.output == "-") {
    fmt::print("{}", text);
  } else {
    write_file_atomically(o.output, text);
    fmt::print(stderr, "wrote {} rows ({} slices x {} diagnostics) to {}\n", rows.size(), plan.slices.size(),
               diagnostic_names().size(), o.output);
  }
  return 0;
}

}  // namespace

Action add_diagnose(CLI::App& app) {
  auto o = std::make_shared<DiagnoseOptions>();
  app.add_option("dump", o->dump, "the dump")->required();
  app.add_option("--lengths,--length", o->lengths,
                 "prefix lengths, e.g. 64..4096:x2; default: each item's full length");
  app.add_option("--layers", o->layers, "layer numbers: all (default), a list or a range");
  app.add_option("--heads", o->heads, "head indices: all (default), a list or a range");
  app.add_option("--batch", o->batch, "batch items: all (default), a list or a range");
  app.add_option("--mask", o->mask,
                 "the mask the diagnostics describe: full (default), causal, window:W, or auto (each layer's "
                 "attributes, as sweep's default)")
      ->capture_default_str();
  app.add_option("--queries", o->queries,
                 "the query rows: all (default) or last:W (the last W rows of each length against all its keys, a "
                 "decode step), a list")
      ->capture_default_str();
  app.add_option("--threads", o->threads, "worker threads (0 = all cores); results do not depend on it")
      ->check(CLI::Range(0, kMaxThreads));
  app.add_option("-o,--output", o->output, "the CSV to write (default: standard output)");
  app.add_flag("-q,--quiet", o->quiet, "no progress");
  add_dump_options(app, o->dump_options);
  app.footer(
      "Example:\n  attnprobe diagnose data/charlm-hd64.h5 --lengths 1024,4096 -o out/diagnose.csv\n"
      "  /usr/bin/python3 plots/diagnostics_vs_error.py out/diagnose.csv out/sweep.csv -o out/why.png\n\n"
      "  attnprobe diagnose data/charlm-causal.safetensors --mask causal --queries all,last:16 --lengths 1024\n\n"
      "Columns: dump,layer,head,batch,n,p,mask,queries,diagnostic,value (long, one row per slice, length, query "
      "rows and diagnostic), each a mean over the evaluated query rows under the mask:\n"
      "  entropy            mean row entropy of A = softmax(s QK^T), nats (ln n = uniform)\n"
      "  effective_support  mean number of keys holding 90% of a row's mass\n"
      "  max_logit          largest s q.k\n"
      "  stable_rank        |A|_F^2 / |A|_2^2 (1: rank one, e.g. uniform)\n"
      "  mean_distance      mean over rows of sum_j A_ij |t_i - j| (tokens; t_i the row's position)\n"
      "  q_norm_cv, k_norm_cv  std/mean of the query and key row norms\n"
      "  sink_mass          mean weight on the first 4 keys (the attention sinks StreamingLLM keeps)\n"
      "Cost: O(n^2 p) per slice for the row statistics plus 30 power iterations for |A|_2.");
  return [o] { return run_diagnose(*o); };
}

}  // namespace attnprobe::cli
