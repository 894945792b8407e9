#include "attnprobe/bench/fma_peak.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace attnprobe {

namespace {
// 12 independent accumulators hide the 4-cycle FMA latency on two FMA ports (4 × 2 = 8 needed).
constexpr int kChains = 12;
constexpr long kInner = 1 << 16;

#if defined(__AVX512F__)
constexpr int kLanes = 16;
float run_chains(long rounds) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
float run_chains(long rounds) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  float out[8];
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  _mm256_storeu_ps(out, sum);
  return out[0] + out[7];
}
#else
constexpr int kLanes = 1;
float run_chains(long rounds) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 0.001f * c;
  for (long r = 0; r < rounds; ++r)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * 0.999999f + 1e-7f;
  float sum = 0;
  for (float v : acc) sum += v;
  return sum;
}
#endif
}  // namespace

const char* fma_peak_isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2-fma";
#else
  return "scalar";
#endif
}

double measure_fma_peak_gflops(int threads, double seconds) {
  std::atomic<long> total_rounds{0};
  std::atomic<float> sink{0};
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      long rounds = 0;
      float keep = 0;
      while (std::chrono::steady_clock::now() < deadline) {
        keep += run_chains(kInner);
        rounds += kInner;
      }
      total_rounds += rounds;
      sink = sink + keep;  // keeps the chains from being optimised away
    });
  for (auto& w : workers) w.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(total_rounds) * kChains * kLanes * 2.0 / elapsed * 1e-9;
}

}  // namespace attnprobe
