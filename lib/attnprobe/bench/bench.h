#pragma once
// `attnprobe bench`: per-call time of exact attention and estimators on random inputs, beside
// two references measured in the same run: the machine's fp32 FMA peak (bench/fma_peak.h) and the
// OpenBLAS sgemm floor (bench/openblas_floor.h) on the same shapes (the two products Q·Kᵀ and
// P·V, 4·n²·p flops), so exact attention's GFLOP/s reads as a fraction of both. With `backward`,
// it times Estimator::backward (the gradient of ⟨G, Y⟩ for an N(0,1) upstream G, float64, on the
// CPU) instead of the forward estimate: how a gradient estimate's cost grows with n. With `queries` last:W it
// times a decode step, the last W query rows against all n keys, and reports the bytes it must read per
// second beside the machine's memory bandwidth measured in the same run (bench/memory_bandwidth.h).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnprobe/common/rounding.h"
#include "attnprobe/view/mask.h"

namespace attnprobe {

struct BenchRequest {
  std::vector<std::string> estimators = {"softmax"};
  std::vector<int64_t> lengths = {512, 1024, 2048, 4096};
  int64_t p = 64;
  std::vector<int64_t> samples;  ///< empty: each spec's own
  std::vector<int64_t> threads = {1, 2};
  int repeat = 5;
  bool sgemm_floor = true;
  uint64_t seed = 0;
  std::string device = "cpu";  ///< cpu | cuda (the fma-peak and sgemm-floor rows are CPU ceilings)
  bool backward = false;       ///< time Estimator::backward (CPU only; estimators with a backward form)
  Mask mask = Mask::kFull;     ///< causal: every estimator runs its causal form
  /// all (self-attention of n rows) or last:W (the last W rows against the n keys: a decode step; CPU, forward,
  /// estimators with a decode form). Each length is timed for each entry, in this order.
  std::vector<QueryRows> queries = {QueryRows{}};
  /// f32, or bf16/f16: the estimate at that precision (estimate_at_precision on inputs rounded before the timing,
  /// docs/precision.md): the CPU emulation's cost, what a --precision sweep pays, not a GPU's speed in the dtype.
  /// Each entry is timed for each length and query rows, in this order (CPU, forward).
  std::vector<Precision> precisions = {Precision::kF32};
};

struct BenchRow {
  std::string estimator, spec;
  int64_t n = 0, p = 0;
  std::string samples;
  int64_t threads = 1;
  std::string device = "cpu";
  int repeats = 0;
  double seconds_median = 0, seconds_min = 0;
  std::optional<double> gflops;  ///< from the median time
  Mask mask = Mask::kFull;
  std::string pass = "forward";  ///< forward | backward | state (what was timed; state: bench.cpp)
  /// gflops as a fraction of the fp32 FMA peak measured in the same run on as many threads (CPU rows
  /// with counted flops): where the estimator sits under the roofline.
  std::optional<double> peak_fraction;
  QueryRows queries;  ///< all, or last:W (n is then the key count)
  /// Decode rows (last:W): the bytes a call must move at least — K and V once (n·(p + pv) floats), the W query
  /// rows and the W output rows, 4 bytes each — per median second. On the `read-bandwidth` and
  /// `copy-bandwidth` ceiling rows, the measured bandwidth.
  std::optional<double> bytes_per_second;
  /// bytes_per_second over the read bandwidth measured in the same run on as many threads (1 on that row).
  std::optional<double> bandwidth_fraction;
  Precision precision = Precision::kF32;  ///< f32 on every ceiling row
};

extern const char* const kBenchHeader;
std::string format_bench_csv_row(const BenchRow& row);

/// What the sgemm-floor rows use ("OpenBLAS 0.3.21 ... core SkylakeX"), or why there are none.
std::string bench_floor_description();

/// Checks a request before anything is timed or printed: repeat and p, the device, each spec (and
/// its mask support; with `backward`, that it has a backward pass, the device is the CPU and the
/// mask full). Throws UsageError.
void check_bench_request(const BenchRequest& request);

/// Each call once untimed, then `repeat` rounds of one timed call of each, in turn: each call's (median,
/// minimum) seconds. Timed in turn, the calls share the host's slow minutes (these VMs drift by 10–30% over a
/// few minutes), so the ratios between them hold better than those of calls timed one block after another;
/// run_bench times a spec on every thread count of the request this way. `prepare`, when given (one per
/// call, any may be empty), runs untimed right before each of its call's timed runs: run_bench wakes the
/// call's pool with it, whose threads slept through the other counts' calls (see run_bench).
std::vector<std::pair<double, double>> time_interleaved(int repeat, const std::vector<std::function<void()>>& calls,
                                                        const std::vector<std::function<void()>>& prepare = {});

/// Runs the grid (after check_bench_request); `on_row` sees each row as soon as it is measured.
std::vector<BenchRow> run_bench(const BenchRequest& request, const std::function<void(const BenchRow&)>& on_row);

}  // namespace attnprobe
