// attnprobe_gpu_bench: kernel-level timing of the CUDA backend with the data already on the device
// (what a whole sweep on the GPU pays), beside the error of each exact-attention precision against
// the fp64 kernel. `attnprobe bench --device cuda` times whole calls instead (upload + kernels +
// download). Each point: poisoned output (NaN) before the first call, a check that every element
// was written and finite, 2 warm-up calls, then the median of --repeat calls timed with CUDA events.
// Flops: 4·n·keys·p for exact attention (4·p·n(n+1)/2 causal). Bytes (memory-bound kernels): each
// input read once plus the output written once; such inputs rotate over enough copies to exceed
// the 50 MB L2 so repeated calls do not time the cache.
// Decode (`--decode-keys`): W query rows at the end of a cache of n keys, causal (W decode steps), read
// against `read`, the device's read bandwidth over the same K and V (each float once, in this run): decode
// reads K and V once, so its time over the read time is how far it is from its bound; bytes = K, V, the
// rows and the output. `gqa` is 4 query heads × 16 steps of one kv group (64 rows, K and V read once).
// Usage: attnprobe_gpu_bench [--lengths 4096,16384,65536] [--dims 64,128] [--repeat 10]
//        [--tf32-peak TFLOPS] [--copy-peak GBPS] [--csv FILE] [--tiles]
//        [--decode-keys 65536,262144,1048576] [--decode-only] [--decode-tuning]
// --decode-tuning adds the decode kernel at 4, 8 and 16 rows a warp and at other fewest keys a block.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/flash_attention_tc.h"

namespace {

using attnprobe::gpu::AttentionPrecision;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> values;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) values.push_back(std::stoll(item));
  return values;
}

struct DeviceArray {
  float* data = nullptr;
  explicit DeviceArray(size_t count) { check(cudaMalloc(&data, count * sizeof(float)), "cudaMalloc"); }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

std::vector<float> random_normal(size_t count, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(count);
  for (float& x : values) x = normal(engine);
  return values;
}

std::unique_ptr<DeviceArray> upload(const std::vector<float>& host) {
  auto array = std::make_unique<DeviceArray>(host.size());
  check(cudaMemcpy(array->data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  return array;
}

std::vector<float> download(const float* device, size_t count) {
  std::vector<float> host(count);
  check(cudaMemcpy(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost), "download");
  return host;
}

// Median milliseconds of `repeat` calls after 2 warm-ups; call(r) gets the repetition index.
double median_ms(int repeat, const std::function<void(int)>& call) {
  call(0);
  call(1);
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    check(cudaEventRecord(start), "record");
    call(r);
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// ‖a − b‖ / ‖b‖ over the first `count` floats; NaN if a has a non-finite entry.
double relative_error(const std::vector<float>& a, const std::vector<float>& b, size_t count) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(a[i])) return NAN;
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

struct Options {
  std::vector<int64_t> lengths = {4096, 16384, 65536}, dims = {64, 128};
  int repeat = 10;
  double tf32_peak = 410.5, copy_peak = 3000;  // run 1 on the H100 (tools/gpu_ceilings.py)
  std::vector<int64_t> decode_keys = {65536, 262144, 1048576};
  std::string csv;
  bool tiles = false, decode_only = false, decode_tuning = false;
};

// Decode attention at each cache length of o.decode_keys (see the file's comment), head dim p = pv.
template <typename Emit>
void bench_decode(const Options& o, int64_t p, attnprobe::gpu::Scratch& scratch, const Emit& emit) {
  using attnprobe::gpu::KeyMask;
  const float scale = 1.0f / std::sqrt(static_cast<float>(p));
  const int64_t most_keys = *std::max_element(o.decode_keys.begin(), o.decode_keys.end()), most_rows = 64;
  // One draw of the largest cache; shorter ones are its first keys.
  const auto k_host = random_normal(most_keys * p, 21), v_host = random_normal(most_keys * p, 22);
  const auto q_host = random_normal(most_rows * p, 23);
  auto q = upload(q_host);
  for (int64_t keys : o.decode_keys) {
    // Copies of K and V past the L2 (≥ 400 MB in all), so repeated calls read memory, not the cache.
    const size_t matrix_bytes = keys * p * sizeof(float);
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{400} << 20) / (2 * matrix_bytes) + 1, 1, 64));
    std::vector<std::unique_ptr<DeviceArray>> ks, vs;
    for (int c = 0; c < copies; ++c) {
      ks.push_back(std::make_unique<DeviceArray>(keys * p));
      vs.push_back(std::make_unique<DeviceArray>(keys * p));
      check(cudaMemcpy(ks.back()->data, k_host.data(), matrix_bytes, cudaMemcpyHostToDevice), "upload");
      check(cudaMemcpy(vs.back()->data, v_host.data(), matrix_bytes, cudaMemcpyHostToDevice), "upload");
    }
    const double read_ms = median_ms(o.repeat, [&](int r) {
      attnprobe::gpu::read_all_device(ks[r % copies]->data, keys * p, scratch);
      attnprobe::gpu::read_all_device(vs[r % copies]->data, keys * p, scratch);
    });
    const double read_gbps = 2.0 * matrix_bytes / read_ms * 1e-6;
    emit("read", "K+V", keys, p, read_ms, read_gbps, "GB/s", read_gbps / o.copy_peak, 0.0);

    struct Variant {
      std::string name;
      int64_t rows, heads;
      bool fp64;
      int per_warp = 0;        // set_decode_tuning: rows a warp (0: the default for the row count)
      int64_t split_keys = 0;  // and the fewest keys a block
    };
    std::vector<Variant> variants = {{"rows=1", 1, 1, false},   {"rows=4", 4, 1, false},
                                     {"rows=16", 16, 1, false}, {"gqa=4x16", 64, 4, false},
                                     {"rows=64", 64, 1, false}, {"rows=16,fp64", 16, 1, true}};
    if (o.decode_tuning) {
      for (int64_t rows : {16, 64})
        for (int per_warp : {4, 8, 16})
          variants.push_back(
              {"rows=" + std::to_string(rows) + ",R=" + std::to_string(per_warp), rows, 1, false, per_warp});
      for (int64_t rows : {1, 16})
        for (int64_t split_keys : {128, 2048})
          variants.push_back(
              {"rows=" + std::to_string(rows) + ",split=" + std::to_string(split_keys), rows, 1, false, 0, split_keys});
    }
    for (const Variant& variant : variants) {
      attnprobe::gpu::set_decode_tuning(variant.per_warp, variant.split_keys);
      const int64_t rows = variant.rows, steps = rows / variant.heads;
      std::vector<int64_t> positions(rows);
      for (int64_t i = 0; i < rows; ++i) positions[i] = keys - steps + i % steps;
      int64_t* device_positions = nullptr;
      check(cudaMalloc(&device_positions, rows * sizeof(int64_t)), "cudaMalloc");
      check(cudaMemcpy(device_positions, positions.data(), rows * sizeof(int64_t), cudaMemcpyHostToDevice), "upload");
      DeviceArray out(rows * p), reference(rows * p);
      auto call = [&](int r, bool fp64, float* into) {
        attnprobe::gpu::decode_attention_device(q->data, device_positions, ks[r % copies]->data, vs[r % copies]->data,
                                                rows, keys, p, p, scale, KeyMask::kCausal, 0, fp64, scratch, into);
      };
      check(cudaMemset(out.data, 0xff, rows * p * sizeof(float)), "poison");  // NaN everywhere
      call(0, variant.fp64, out.data);
      call(0, true, reference.data);
      check(cudaDeviceSynchronize(), variant.name.c_str());
      const auto result = download(out.data, rows * p);
      double error = relative_error(result, download(reference.data, rows * p), rows * p);
      for (float x : result)
        if (!std::isfinite(x)) error = NAN;
      const double ms = median_ms(o.repeat, [&](int r) { call(r, variant.fp64, out.data); });
      const double bytes = 2.0 * matrix_bytes + 2.0 * rows * p * sizeof(float);
      const double gbps = bytes / ms * 1e-6;
      // fraction: of the read rate measured just before (1 = at the read bound).
      emit("decode", variant.name, keys, p, ms, gbps, "GB/s", gbps / read_gbps, error);
      cudaFree(device_positions);
      attnprobe::gpu::set_decode_tuning(0, 0);
    }
  }
}
}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--lengths")
      o.lengths = parse_list(value());
    else if (arg == "--dims")
      o.dims = parse_list(value());
    else if (arg == "--repeat")
      o.repeat = std::stoi(value());
    else if (arg == "--tf32-peak")
      o.tf32_peak = std::stod(value());
    else if (arg == "--copy-peak")
      o.copy_peak = std::stod(value());
    else if (arg == "--csv")
      o.csv = value();
    else if (arg == "--tiles")
      o.tiles = true;
    else if (arg == "--decode-keys")
      o.decode_keys = parse_list(value());
    else if (arg == "--decode-only")
      o.decode_only = true;
    else if (arg == "--decode-tuning")
      o.decode_tuning = true;
    else
      throw std::runtime_error("unknown argument " + arg);
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# %s, %d SMs, L2 %d MB; ceilings: tf32 %.1f TFLOP/s, copy %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, o.tf32_peak, o.copy_peak);
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    csv << "kernel,variant,n,p,ms,rate,unit,fraction,error\n";
  }
  std::printf("%-8s %-16s %6s %4s %10s %10s %-8s %6s %10s\n", "kernel", "variant", "n", "p", "ms", "rate", "unit",
              "frac", "error");
  auto emit = [&](const char* kernel, const std::string& variant, int64_t n, int64_t p, double ms, double rate,
                  const char* unit, double fraction, double error) {
    std::printf("%-8s %-16s %6lld %4lld %10.4f %10.1f %-8s %6.3f %10.2e\n", kernel, variant.c_str(),
                static_cast<long long>(n), static_cast<long long>(p), ms, rate, unit, fraction, error);
    std::fflush(stdout);
    if (csv)
      csv << kernel << "," << variant << "," << n << "," << p << "," << ms << "," << rate << "," << unit << ","
          << fraction << "," << error << "\n";
  };

  attnprobe::gpu::Scratch scratch;
  if (!o.decode_only)
    for (int64_t p : o.dims)
      for (int64_t n : o.lengths) {
        const float scale = 1.0f / std::sqrt(static_cast<float>(p));
        auto q = upload(random_normal(n * p, 1 + n)), k = upload(random_normal(n * p, 2 + n)),
             v = upload(random_normal(n * p, 3 + n));
        DeviceArray out(n * p);
        // The reference: the fp64 kernel on the first rows (all keys), full and causal.
        const int64_t ref_rows = std::min<int64_t>(n, 1024);
        DeviceArray ref(ref_rows * p), ref_causal(ref_rows * p);
        attnprobe::gpu::exact_attention_device(q->data, k->data, v->data, ref_rows, n, p, p, scale, false,
                                               AttentionPrecision::kFp64, scratch, ref.data);
        // Causal rows 0..ref_rows−1 see keys 0..i only: keys = n is fine for the fp64 kernel's mask.
        attnprobe::gpu::exact_attention_device(q->data, k->data, v->data, ref_rows, ref_rows, p, p, scale, true,
                                               AttentionPrecision::kFp64, scratch, ref_causal.data);
        check(cudaDeviceSynchronize(), "reference");
        const auto ref_host = download(ref.data, ref_rows * p),
                   ref_causal_host = download(ref_causal.data, ref_rows * p);

        struct Variant {
          std::string name;
          AttentionPrecision precision;
          bool causal;
          int warps = 0, m_tiles = 0, block_n = 0;
        };
        std::vector<Variant> variants = {{"tf32", AttentionPrecision::kTf32, false},
                                         {"tf32x3", AttentionPrecision::kTf32x3, false},
                                         {"tf32-causal", AttentionPrecision::kTf32, true},
                                         {"tf32x3-causal", AttentionPrecision::kTf32x3, true}};
        if (n <= 16384) {  // the CUDA-core kernel: fp64 is `sweep --device cuda`'s reference
          variants.push_back({"fp32-cores", AttentionPrecision::kFp32, false});
          variants.push_back({"fp64-cores", AttentionPrecision::kFp64, false});
          variants.push_back({"fp64-cores-causal", AttentionPrecision::kFp64, true});
        }
        if (o.tiles) {
          const std::vector<std::array<int, 3>> shapes =
              p <= 64 ? std::vector<std::array<int, 3>>{{4, 1, 64}, {8, 1, 64}, {4, 2, 32}}
                      : std::vector<std::array<int, 3>>{{4, 1, 32}, {8, 1, 64}, {4, 1, 64}};
          for (auto [w, m, b] : shapes)
            variants.push_back({"tf32-w" + std::to_string(w) + "m" + std::to_string(m) + "b" + std::to_string(b),
                                AttentionPrecision::kTf32, false, w, m, b});
        }
        for (const Variant& variant : variants) {
          attnprobe::gpu::set_flash_tiles(variant.warps, variant.m_tiles, variant.block_n);
          auto call = [&](int) {
            attnprobe::gpu::exact_attention_device(q->data, k->data, v->data, n, n, p, p, scale, variant.causal,
                                                   variant.precision, scratch, out.data);
          };
          check(cudaMemset(out.data, 0xff, n * p * sizeof(float)), "poison");  // NaN everywhere
          call(0);
          check(cudaDeviceSynchronize(), variant.name.c_str());
          const auto result = download(out.data, n * p);
          double error = relative_error(result, variant.causal ? ref_causal_host : ref_host, ref_rows * p);
          for (float x : result)
            if (!std::isfinite(x)) error = NAN;  // an unwritten (poisoned) or non-finite element anywhere
          const double ms = median_ms(o.repeat, call);
          const double flops = variant.causal ? 4.0 * p * n * (n + 1) / 2 : 4.0 * n * n * p;
          const double tflops = flops / ms * 1e-9;
          emit("exact", variant.name, n, p, ms, tflops, "TFLOP/s", tflops / o.tf32_peak, error);
        }
        attnprobe::gpu::set_flash_tiles(0, 0, 0);

        // vmean: reads keys × pv, writes n × pv; inputs rotate past the L2.
        const size_t bytes = 2 * n * p * sizeof(float);
        const int copies = static_cast<int>(std::clamp<size_t>((size_t{200} << 20) / bytes + 1, 1, 32));
        std::vector<std::unique_ptr<DeviceArray>> vs, outs;
        for (int c = 0; c < copies; ++c) {
          vs.push_back(std::make_unique<DeviceArray>(n * p));
          outs.push_back(std::make_unique<DeviceArray>(n * p));
          check(cudaMemcpy(vs.back()->data, v->data, n * p * sizeof(float), cudaMemcpyDeviceToDevice), "copy");
        }
        check(cudaMemset(outs[0]->data, 0xff, n * p * sizeof(float)), "poison");
        attnprobe::gpu::vmean_device(vs[0]->data, n, n, p, scratch, outs[0]->data);
        check(cudaDeviceSynchronize(), "vmean");
        const auto mean_rows = download(outs[0]->data, n * p);
        const auto v_host = download(v->data, n * p);
        std::vector<double> column(p, 0.0);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < p; ++c) column[c] += v_host[j * p + c];
        std::vector<float> expected(n * p);
        for (int64_t i = 0; i < n * p; ++i) expected[i] = static_cast<float>(column[i % p] / n);
        const double vmean_error = relative_error(mean_rows, expected, n * p);
        const double ms = median_ms(o.repeat, [&](int r) {
          attnprobe::gpu::vmean_device(vs[r % copies]->data, n, n, p, scratch, outs[r % copies]->data);
        });
        const double gbps = bytes / ms * 1e-6;
        emit("vmean", "device", n, p, ms, gbps, "GB/s", gbps / o.copy_peak, vmean_error);

        // performer(M=64), float64 as the estimator: reads Q̃, K̃, V (float64), writes out (float32).
        {
          const int64_t features = 64;
          auto upload_double = [&](size_t count, uint64_t seed) {
            const auto values = random_normal(count, seed);
            std::vector<double> host(values.begin(), values.end());
            for (double& x : host) x *= std::sqrt(scale);  // Q̃ = √s·Q as the estimator passes
            double* device = nullptr;
            check(cudaMalloc(&device, count * sizeof(double)), "cudaMalloc");
            check(cudaMemcpy(device, host.data(), count * sizeof(double), cudaMemcpyHostToDevice), "upload");
            return device;
          };
          double *dq = upload_double(n * p, 11 + n), *dk = upload_double(n * p, 12 + n),
                 *dv = upload_double(n * p, 13 + n), *dw = upload_double(features * p, 14 + n);
          DeviceArray pout(n * p);
          check(cudaMemset(pout.data, 0xff, n * p * sizeof(float)), "poison");
          attnprobe::gpu::performer_device(dq, dk, dv, dw, n, n, p, p, features, scratch, pout.data);
          check(cudaDeviceSynchronize(), "performer");
          double finite = 0;
          for (float x : download(pout.data, n * p))
            if (!std::isfinite(x)) finite = NAN;
          const double pms = median_ms(o.repeat, [&](int) {
            attnprobe::gpu::performer_device(dq, dk, dv, dw, n, n, p, p, features, scratch, pout.data);
          });
          const double pbytes = 3.0 * n * p * sizeof(double) + n * p * sizeof(float);
          emit("perform", "M=64,fp64", n, p, pms, pbytes / pms * 1e-6, "GB/s", pbytes / pms * 1e-6 / o.copy_peak,
               finite);
          for (double* d : {dq, dk, dv, dw}) cudaFree(d);
        }
      }
  for (int64_t p : o.dims) bench_decode(o, p, scratch, emit);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attnprobe_gpu_bench: %s\n", e.what());
  return 1;
}
