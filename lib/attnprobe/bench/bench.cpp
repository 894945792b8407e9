#include "attnprobe/bench/bench.h"

#include "attnprobe/bench/fma_peak.h"
#include "attnprobe/bench/memory_bandwidth.h"
#include "attnprobe/bench/openblas_floor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/rounded_estimate.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/rng/random_matrix.h"
#include "attnprobe/view/rounded_view.h"

namespace attnprobe {

const char* const kBenchHeader =
    "estimator,spec,n,p,samples,threads,device,repeats,seconds_median,seconds_min,gflops,mask,pass,peak_fraction,"
    "queries,bytes_per_second,bandwidth_fraction,precision";

std::string format_bench_csv_row(const BenchRow& r) {
  auto optional = [](const std::optional<double>& x) { return x ? fmt::format("{:.4g}", *x) : std::string(); };
  return fmt::format("{},{},{},{},{},{},{},{},{:.9g},{:.9g},{},{},{},{},{},{},{},{}\n", csv_field(r.estimator),
                     csv_field(r.spec), r.n, r.p, r.samples, r.threads, r.device, r.repeats, r.seconds_median,
                     r.seconds_min, optional(r.gflops), mask_name(r.mask), r.pass, optional(r.peak_fraction),
                     query_rows_text(r.queries), optional(r.bytes_per_second), optional(r.bandwidth_fraction),
                     precision_name(r.precision));
}

namespace {
// Median and minimum of `seconds` (sorted in place).
std::pair<double, double> median_and_min(std::vector<double>& seconds) {
  std::sort(seconds.begin(), seconds.end());
  const size_t mid = seconds.size() / 2;
  const double median = seconds.size() % 2 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid]);
  return {median, seconds.front()};
}
}  // namespace

std::vector<std::pair<double, double>> time_interleaved(int repeat, const std::vector<std::function<void()>>& calls,
                                                        const std::vector<std::function<void()>>& prepare) {
  for (const auto& call : calls) call();
  std::vector<std::vector<double>> seconds(calls.size());
  for (int r = 0; r < repeat; ++r)
    for (size_t c = 0; c < calls.size(); ++c) {
      if (c < prepare.size() && prepare[c]) prepare[c]();
      const auto start = std::chrono::steady_clock::now();
      calls[c]();
      seconds[c].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  std::vector<std::pair<double, double>> out;
  for (auto& s : seconds) out.push_back(median_and_min(s));
  return out;
}

namespace {

// Median and minimum of `repeat` timed calls after one untimed warm-up call.
std::pair<double, double> time_calls(int repeat, const std::function<void()>& call) {
  return time_interleaved(repeat, {call}).front();
}

HeadView random_view(int64_t n, int64_t p, uint64_t seed) {
  const RandomStream stream(make_random_key(seed, "bench", 0), Purpose::kGeneric);
  return make_head_view(SliceId{0, 0, 0, n}, 1.0 / std::sqrt(static_cast<double>(p)), normal_rows(stream, n, p, 0),
                        normal_rows(stream, n, p, 1), normal_rows(stream, n, p, 2));
}

// The upstream gradient G of a backward pass: n × pv, iid N(0, 1), from its own keyed stream.
MatrixD random_upstream(int64_t n, int64_t pv, uint64_t seed) {
  const RandomStream stream(make_random_key(seed, "bench;upstream", 0), Purpose::kGeneric);
  return normal_rows(stream, n, pv);
}

}  // namespace

std::string bench_floor_description() { return OpenBlasFloor::instance().description(); }

namespace {

std::vector<Spec> bench_specs(const BenchRequest& request) {
  std::vector<Spec> specs;
  for (const std::string& text : request.estimators) {
    const Spec base = parse_spec(text);
    if (request.samples.empty() || !base.has_samples_knob())
      specs.push_back(base);
    else
      for (int64_t s : request.samples) specs.push_back(base.with_samples(s));
  }
  return specs;
}

}  // namespace

void check_bench_request(const BenchRequest& request) {
  if (request.repeat < 1) throw UsageError("--repeat must be at least 1");
  if (request.p < 1) throw UsageError("--p must be at least 1");
  for (int64_t n : request.lengths)
    if (n < 2) throw UsageError("bench lengths must be at least 2");
  // A pool per thread count, all alive at once (run_bench times them in turn).
  int64_t pooled = 0;
  for (int64_t threads : request.threads) pooled += threads;
  if (pooled > kMaxThreads)
    throw UsageError(
        fmt::format("--threads: the counts are timed together, each with its own pool, so their sum must "
                    "be at most {} (got {}); time fewer counts per run",
                    kMaxThreads, pooled));
  const Device device = parse_device(request.device);
  bool decode = false;
  for (const QueryRows& rows : request.queries) {
    if (rows.kind == QueryRows::Kind::kDump) throw UsageError("bench --queries takes all or last:W");
    if (rows.all()) continue;
    decode = true;
    for (int64_t n : request.lengths)
      if (rows.last > n)
        throw UsageError(fmt::format("--queries {}: W is past the length {} (W query rows need at least W keys)",
                                     query_rows_text(rows), n));
  }
  if (decode && request.backward) throw UsageError("--backward times whole slices: leave --queries all");
  if (request.precisions.empty()) throw UsageError("--precision selects no precision (use f32, bf16, f16 or a list)");
  for (Precision precision : request.precisions) {
    if (precision == Precision::kF64)
      throw UsageError(
          "--precision f64: estimators compute in float32 (f32) or rounded below it (bf16, f16); use f32, bf16 or "
          "f16");
    if (!below_float32(precision)) continue;
    if (request.backward) throw UsageError("--backward times float64 backward passes: leave --precision f32");
    if (device != Device::kCpu)
      throw UsageError(
          fmt::format("--precision {} times the CPU's emulation of the rounding points; run it with --device cpu",
                      precision_name(precision)));
  }
  const bool all_rows =
      std::any_of(request.queries.begin(), request.queries.end(), [](const QueryRows& q) { return q.all(); });
  for (const Spec& spec : bench_specs(request)) {
    // One that builds its cache from a prompt (snapkv, h2o, tova) has decode rows only: timed with --queries last:W
    // alone (asked for all rows, the check below says so).
    if (!spec.capabilities().decode_only() || all_rows)
      require_mask_support(spec, request.mask, device);  // before a missing GPU (exit 3) can hide it
    if (decode) require_form_support(spec, request.mask, /*decode=*/true, device);
    make_estimator(spec, device);  // an estimator without a version for the device: UsageError
    if (!request.backward) continue;
    // Backward passes are float64 host code (sweeps take them from the CPU version too).
    if (device != Device::kCpu) throw UsageError("--backward times the CPU backward passes: leave --device cpu");
    if (spec.capabilities().backward == Backward::kNone)
      throw UsageError(fmt::format("--backward: '{}' has no backward pass (`attnprobe list` shows which have one)",
                                   spec.canonical()));
    if (request.mask == Mask::kCausal && !spec.capabilities().backward_forms.has(Mask::kCausal))
      throw UsageError(
          fmt::format("--backward --mask causal: '{}' has no backward pass for its causal form yet; "
                      "time it with --mask full",
                      spec.canonical()));
  }
}

std::vector<BenchRow> run_bench(const BenchRequest& request, const std::function<void(const BenchRow&)>& on_row) {
  check_bench_request(request);
  const std::vector<Spec> specs = bench_specs(request);
  std::vector<BenchRow> rows;
  auto emit = [&](BenchRow row) {
    on_row(row);
    rows.push_back(std::move(row));
  };
  const Device device = parse_device(request.device);
  // The ceiling: vector FMAs with no memory traffic (seconds = the measuring time), per thread count; a
  // row of its own with the floor, and the denominator of every CPU row's peak_fraction.
  std::map<int64_t, double> peak;
  if (device == Device::kCpu && !request.backward)
    for (int64_t threads : request.threads) {
      peak[threads] = measure_fma_peak_gflops(static_cast<int>(threads));
      if (request.sgemm_floor)
        emit(BenchRow{"fma-peak", fma_peak_isa(), 0, 0, "", threads, "cpu", 1, 0.3, 0.3, peak[threads], Mask::kFull,
                      "forward", 1.0});
    }
  // Decode steps read memory: the read and copy bandwidths per thread count, rows of their own beside the FMA
  // peak, and the denominator (read) of every decode row's bandwidth_fraction.
  std::map<int64_t, double> read_bandwidth;
  const bool decode =
      std::any_of(request.queries.begin(), request.queries.end(), [](const QueryRows& q) { return !q.all(); });
  if (device == Device::kCpu && decode)
    for (int64_t threads : request.threads) {
      const MemoryBandwidth bandwidth = measure_memory_bandwidth(static_cast<int>(threads));
      read_bandwidth[threads] = bandwidth.read;
      if (!request.sgemm_floor) continue;
      BenchRow read{"read-bandwidth", "sum of 256 MiB of floats", 0, 0, "", threads, "cpu", 1, 0.15, 0.15};
      read.bytes_per_second = bandwidth.read;
      read.bandwidth_fraction = 1.0;
      emit(read);
      BenchRow copy{"copy-bandwidth", "memcpy of 256 MiB (read + written)", 0, 0, "", threads, "cpu", 1, 0.15, 0.15};
      copy.bytes_per_second = bandwidth.copy;
      copy.bandwidth_fraction = bandwidth.copy / bandwidth.read;
      emit(copy);
    }
  auto fraction = [&](int64_t threads, std::optional<double> gflops) -> std::optional<double> {
    if (!gflops || !peak.count(threads) || !(peak[threads] > 0)) return std::nullopt;
    return *gflops / peak[threads];
  };
  // Estimators for every point first, the OpenBLAS floors last: OpenBLAS's idle worker threads
  // spin for a while after a multi-threaded call and would steal a core from what comes next.
  // One pool per thread count, all kept for the run: a spec's calls on every thread count are timed in turn
  // (time_interleaved), so its --threads 1,2 ratio comes from the same minutes of the host.
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int64_t threads : request.threads) pools.push_back(std::make_unique<ThreadPool>(static_cast<int>(threads)));
  for (int64_t n : request.lengths)
    for (const QueryRows& queries : request.queries) {
      HeadView whole = random_view(n, request.p, request.seed);
      whole.mask = request.mask;
      // A decode step: the last W rows at positions n − W..n − 1 against all n keys (view/head_view.h).
      const HeadView stored = queries.all() ? std::move(whole) : last_rows(whole, queries.last);
      for (const Precision precision : request.precisions) {
        // Below float32 the inputs are rounded once, before the timing, as a sweep rounds them once per slice.
        const HeadView rounded = below_float32(precision) ? rounded_view(stored, precision) : HeadView{};
        const HeadView& view = below_float32(precision) ? rounded : stored;
        const int64_t rows_timed = view.n();
        const MatrixD upstream = request.backward ? random_upstream(n, view.pv(), request.seed) : MatrixD();
        for (const Spec& spec : specs) {
          const std::unique_ptr<Estimator> estimator = make_estimator(spec, device);
          const RandomKey key = make_random_key(request.seed, "bench;" + spec.canonical(), 0);
          std::vector<MatrixF> outs(pools.size());
          std::vector<std::function<void()>> calls, wake;
          for (size_t t = 0; t < pools.size(); ++t) {
            const EstimateContext ctx{key, pools[t].get()};
            if (request.backward)
              calls.push_back([&, ctx] { estimator->backward(view, upstream, ctx); });
            else
              calls.push_back([&, ctx, t] { estimate_at_precision(*estimator, view, ctx, precision, outs[t]); });
            // An empty parallel region before each timed call: the pool's threads went to sleep during the other
            // thread counts' calls (they spin only 1 ms), and the call's first region would pay their futex
            // wake-up (tens of µs on these VMs: common/parallel.h), a few percent of a 1 ms call. Calls in a row
            // on one pool, as a sweep makes them, find them awake.
            ThreadPool* pool = pools[t].get();
            wake.push_back([pool] { pool->parallel_for(pool->size(), [](int64_t) {}); });
          }
          // A decode step of a kept-keys method also times the state it builds from the cache before its rows
          // (quest's page bounds, moba's block means, magicpig's hash tables, sparq's value prefix, a replay):
          // a serving system keeps that across steps and updates it per new token, so a step's own cost is the
          // forward row's time less this `state` row's.
          const bool state = !request.backward && !queries.all() && device == Device::kCpu &&
                             spec.capabilities().selection;  // it states kept keys (the registry says so)
          if (state)
            for (size_t t = 0; t < pools.size(); ++t) {
              const EstimateContext ctx{key, pools[t].get(), std::nullopt, precision};
              calls.push_back([&, ctx] { estimator->kept_keys(view, ctx); });  // the rows' closure, then freed
              const std::function<void()> wake_pool = wake[t];
              wake.push_back(wake_pool);
            }
          const auto times = time_interleaved(request.repeat, calls, wake);
          // flops() counts the forward pass: no GFLOP/s for a backward row.
          double flops = request.backward ? 0 : estimator->flops(n, request.p, view.pv());
          // A causal exact estimator does the (n + 1)/(2n) of the score pairs that are not masked; the
          // linear estimators' causal forms do the same work as their full forms.
          if (request.mask == Mask::kCausal && spec.def().family == "exact") flops *= (n + 1.0) / (2.0 * n);
          // Decode rows: exact attention does W of the n rows' work (bottom-right rows see nearly every key); the
          // other estimators' flops() count whole slices, so their decode rows have none.
          if (!queries.all())
            flops = spec.def().family == "exact"
                        ? estimator->flops(n, request.p, view.pv()) * static_cast<double>(rows_timed) / n
                        : 0;
          // The least a decode step reads and writes: K and V once, the W query rows and the W output rows.
          const double bytes =
              queries.all() ? 0 : 4.0 * (n * (request.p + view.pv()) + rows_timed * (request.p + view.pv()));
          for (size_t t = 0; t < pools.size(); ++t) {
            const int64_t threads = request.threads[t];
            const auto [median, min] = times[t];
            const std::optional<double> gflops =
                flops > 0 ? std::optional<double>(flops / median * 1e-9) : std::nullopt;
            BenchRow row{spec.name(),
                         spec.canonical(),
                         n,
                         request.p,
                         spec.has_samples_knob() ? std::to_string(spec.samples()) : "",
                         threads,
                         request.device,
                         request.repeat,
                         median,
                         min,
                         gflops,
                         request.mask,
                         request.backward ? "backward" : "forward",
                         fraction(threads, gflops)};
            row.queries = queries;
            row.precision = precision;
            if (bytes > 0) {
              row.bytes_per_second = bytes / median;
              if (read_bandwidth.count(threads)) row.bandwidth_fraction = bytes / median / read_bandwidth[threads];
            }
            emit(row);
            if (!state) continue;
            const auto [state_median, state_min] = times[pools.size() + t];
            BenchRow state_row = row;
            state_row.pass = "state";
            state_row.seconds_median = state_median;
            state_row.seconds_min = state_min;
            state_row.gflops = state_row.peak_fraction = state_row.bytes_per_second = state_row.bandwidth_fraction =
                std::nullopt;
            emit(state_row);
          }
        }
      }
    }
  const OpenBlasFloor& blas = OpenBlasFloor::instance();
  // The floor is a whole slice's two products (an n × n score matrix): nothing to compare a decode step with.
  const bool whole_slices =
      std::any_of(request.queries.begin(), request.queries.end(), [](const QueryRows& q) { return q.all(); });
  if (!request.sgemm_floor || !blas.available() || device != Device::kCpu || request.backward || !whole_slices)
    return rows;
  for (int64_t n : request.lengths) {
    const HeadView view = random_view(n, request.p, request.seed);
    // The floor: the same two products exact attention needs, as two whole sgemm calls with the
    // BLAS's own threading (a materialised n × n score matrix, allocated once).
    MatrixF scores(n, n), out(n, view.pv());
    const int ni = static_cast<int>(n), p = static_cast<int>(request.p), pv = static_cast<int>(view.pv());
    for (int64_t threads : request.threads) {
      blas.set_threads(static_cast<int>(threads));
      auto [median, min] = time_calls(request.repeat, [&] {
        blas.sgemm(true, ni, ni, p, 1.0f, view.qf.data(), p, view.kf.data(), p, 0.0f, scores.data(), ni);
        blas.sgemm(false, ni, pv, ni, 1.0f, scores.data(), ni, view.vf.data(), pv, 0.0f, out.data(), pv);
      });
      const double flops = 2.0 * n * n * request.p + 2.0 * n * n * view.pv();
      emit(BenchRow{"sgemm-floor", "openblas Q*K^T + P*V", n, request.p, "", threads, "cpu", request.repeat, median,
                    min, flops / median * 1e-9, Mask::kFull, "forward", fraction(threads, flops / median * 1e-9)});
    }
    blas.set_threads(1);
  }
  return rows;
}

}  // namespace attnprobe
