#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "attnprobe/bench/bench.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/report/table.h"
#include "attnprobe/sweep/plan.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {
struct BenchCommandOptions {
  std::vector<std::string> estimators;
  std::string lengths = "512..4096:x2", samples, threads = "1,2", device = "cpu", mask = "full", queries = "all", csv,
              precision = "f32";
  int64_t p = 64;
  int repeat = 5;
  bool no_sgemm = false, backward = false;
};
}  // namespace

Action add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchCommandOptions>();
  app.add_option("-e,--estimator", o->estimators, "estimator specs to time (default: softmax)");
  app.add_option("--lengths", o->lengths, "sequence lengths n")->capture_default_str();
  app.add_option("--p", o->p, "head dim (values have the same)")->capture_default_str();
  app.add_option("--samples", o->samples, "values of each estimator's samples knob (default: the spec's own)");
  app.add_option("--threads", o->threads,
                 "thread counts to time, e.g. 1,2; a spec's counts are timed in turn, call by call")
      ->capture_default_str();
  app.add_option("--device", o->device, "cpu or cuda (per call, including the slice's upload and the download)")
      ->capture_default_str();
  app.add_option("--mask", o->mask,
                 "full or causal (each estimator's causal form; `attnprobe list` says which have one)")
      ->capture_default_str();
  app.add_option("--queries", o->queries,
                 "query rows, a list: all (n rows against n keys) or last:W (a decode step: the last W rows against "
                 "the n keys; CPU, estimators with a decode form; those built from a prompt, such as h2o, run only "
                 "these), e.g. last:1,last:64; decode rows report bytes read "
                 "per second beside the read and copy bandwidths measured in the same run, and a method that builds "
                 "state from the cache (quest's page bounds, moba's block means) gets a second row, pass state, "
                 "timing that state alone: a serving system keeps it across steps")
      ->capture_default_str();
  app.add_option("--precision", o->precision,
                 "f32, bf16 or f16, a list: below f32 the estimate at that precision (inputs rounded before the "
                 "timing, each estimator's declared rounding points, the output rounded; docs/precision.md). It "
                 "times the CPU's emulation of the rounding, the cost of a --precision sweep, not a GPU's speed in "
                 "the dtype")
      ->capture_default_str();
  app.add_option("--repeat", o->repeat, "timed calls per point (after one warm-up call)")->capture_default_str();
  app.add_option("--csv", o->csv, "also write the rows to this CSV");
  app.add_flag("--no-sgemm", o->no_sgemm, "skip the fma-peak and sgemm-floor rows");
  app.add_flag("--backward", o->backward,
               "time the backward pass (the gradient of <G, Y> for an N(0,1) upstream G, float64, CPU) instead of the "
               "estimate; only estimators with a backward form (softmax, vmean, performer, yoso, yoso-e); no ceiling "
               "rows");
  app.footer(
      "Example:\n  attnprobe bench --lengths 512..4096:x2 --threads 1,2\n  attnprobe bench -e vmean -e softmax "
      "--lengths 4096 --threads 1 --csv out/bench.csv\n  attnprobe bench --backward -e yoso -e softmax "
      "--lengths 1024..16384:x2 --threads 1\n  attnprobe bench -e softmax -e 'performer(M=64)' --lengths 1024 "
      "--threads 1 --precision f32,bf16\n\n"
      "Inputs are N(0,1) queries, keys and values with scale 1/sqrt(p). gflops counts useful work (4*n^2*p for "
      "exact attention). Two ceilings are measured in the same run on the CPU: fma-peak (vector FMA chains, no memory "
      "traffic: the machine's fp32 peak) and sgemm-floor (the same two products as whole OpenBLAS calls, Q*K^T into an "
      "n x n matrix then P*V, with the BLAS's own threads: the speed exact attention cannot beat by much). With "
      "--device cuda a call includes the slice's upload and the result's download.");
  return [o] {
    BenchRequest r;
    r.device = o->device;
    if (!o->estimators.empty()) r.estimators = o->estimators;
    r.lengths = parse_int_list(o->lengths, "--lengths");
    if (!o->samples.empty()) r.samples = parse_int_list(o->samples, "--samples");
    r.threads = parse_int_list(o->threads, "--threads");
    for (int64_t t : r.threads)
      if (t < 1 || t > kMaxThreads)
        throw UsageError(fmt::format("--threads values must be in 1..{} (got {})", kMaxThreads, t));
    r.p = o->p;
    r.repeat = o->repeat;
    r.sgemm_floor = !o->no_sgemm;
    const auto mask = parse_mask(o->mask);
    if (!mask || mask->mask == Mask::kWindow)
      throw UsageError(fmt::format("--mask is '{}'; it must be full or causal", o->mask));
    r.mask = mask->mask;
    r.backward = o->backward;
    r.queries = parse_query_rows_list(o->queries, "--queries");
    r.precisions = parse_precisions(o->precision);
    check_bench_request(r);  // fail before any output (device, specs, masks, backward passes)
    std::ofstream csv;
    if (!o->csv.empty()) {
      csv.open(o->csv);
      if (!csv) throw InputError(fmt::format("cannot write '{}'", o->csv));
      csv << kBenchHeader << "\n";
    }
    // A row the CSV did not take (a full disk, /dev/full) is an error, not a silently shorter file.
    auto require_written = [&] {
      if (!o->csv.empty() && !csv) throw InputError(fmt::format("writing '{}' failed (disk full?)", o->csv));
    };
    if (r.backward)
      fmt::print("backward passes (float64, CPU): time of Estimator::backward for an N(0,1) upstream gradient\n");
    else if (r.device == "cpu")
      fmt::print("sgemm floor: {}\n", bench_floor_description());
    // Decode runs add the rows timed and the bytes per second against the measured read bandwidth.
    const bool decode = std::any_of(r.queries.begin(), r.queries.end(), [](const QueryRows& q) { return !q.all(); });
    const std::string decode_header =
        decode ? fmt::format(" {:>8} {:>7} {:>5}", "queries", "GB/s", "%read") : std::string();
    // A run with a precision other than f32 names each row's.
    const bool rounding = r.precisions.size() > 1 || r.precisions.front() != Precision::kF32;
    const std::string precision_header = rounding ? fmt::format(" {:>9}", "precision") : std::string();
    fmt::print("{:<14} {:<34} {:>6} {:>4} {:>7} {:>7} {:>12} {:>12} {:>8} {:>6}{}{}\n", "estimator", "spec", "n", "p",
               "samples", "threads", "median ms", "min ms", "GFLOP/s", "%peak", decode_header, precision_header);
    run_bench(r, [&](const BenchRow& row) {
      const std::string decode_columns =
          decode ? fmt::format(" {:>8} {:>7} {:>5}", row.n > 0 ? query_rows_text(row.queries) : "",
                               row.bytes_per_second ? fmt::format("{:.1f}", *row.bytes_per_second * 1e-9) : "",
                               row.bandwidth_fraction ? fmt::format("{:.0f}", 100 * *row.bandwidth_fraction) : "")
                 : std::string();
      const std::string precision_column =
          rounding ? fmt::format(" {:>9}", row.n > 0 ? precision_name(row.precision) : "") : std::string();
      fmt::print("{:<14} {:<34} {:>6} {:>4} {:>7} {:>7} {:>12.3f} {:>12.3f} {:>8} {:>6}{}{}\n", row.estimator, row.spec,
                 row.n, row.p, row.samples, row.threads, row.seconds_median * 1e3, row.seconds_min * 1e3,
                 row.gflops ? fmt::format("{:.1f}", *row.gflops) : "",
                 row.peak_fraction ? fmt::format("{:.1f}", 100 * *row.peak_fraction) : "", decode_columns,
                 precision_column);
      std::fflush(stdout);
      if (!o->csv.empty()) {
        csv << format_bench_csv_row(row) << std::flush;
        require_written();
      }
    });
    if (!o->csv.empty()) {
      csv.close();
      require_written();
    }
    return 0;
  };
}

}  // namespace attnprobe::cli
