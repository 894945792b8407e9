#include "attnprobe/bench/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "attnprobe/common/matrix.h"

namespace attnprobe {

namespace {
// 256 MiB: eight times the 32 MiB L3 of these machines, so a pass streams from memory.
constexpr int64_t kBufferFloats = int64_t{64} << 20;
using Clock = std::chrono::steady_clock;

// Runs pass(thread, begin, end) on `threads` threads over their shares of [0, kBufferFloats), as one timed
// round, until `seconds` have gone; the fastest round's seconds.
template <typename Pass>
double best_round(int threads, double seconds, const Pass& pass) {
  const int64_t share = (kBufferFloats / threads + 15) / 16 * 16;
  double best = 1e300;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  do {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> took(threads);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        ++ready;
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        const auto start = Clock::now();
        pass(t, std::min(kBufferFloats, t * share), std::min(kBufferFloats, (t + 1) * share));
        took[t] = std::chrono::duration<double>(Clock::now() - start).count();
      });
    while (ready.load() < threads) std::this_thread::yield();
    go.store(true, std::memory_order_release);
    for (auto& w : workers) w.join();
    best = std::min(best, *std::max_element(took.begin(), took.end()));  // the round ends with its slowest share
  } while (Clock::now() < deadline);
  return best;
}
}  // namespace

MemoryBandwidth measure_memory_bandwidth(int threads, double seconds) {
  threads = std::max(threads, 1);
  // Eigen-allocated and set (first touch) before timing, so no page fault is timed.
  VectorF source = VectorF::Constant(kBufferFloats, 1.0f), target = VectorF::Zero(kBufferFloats);
  std::vector<float> sums(threads * 16, 0.0f);  // a cache line apart per thread
  const double read = best_round(threads, seconds / 2, [&](int t, int64_t begin, int64_t end) {
    sums[t * 16] += Eigen::Map<const VectorF>(source.data() + begin, end - begin).sum();
  });
  const double copy = best_round(threads, seconds / 2, [&](int, int64_t begin, int64_t end) {
    std::memcpy(target.data() + begin, source.data() + begin, (end - begin) * sizeof(float));
  });
  volatile float sink = sums[0] + target[kBufferFloats / 2];  // keeps the passes
  (void)sink;
  const double bytes = static_cast<double>(kBufferFloats) * sizeof(float);
  return {bytes / read, 2 * bytes / copy};
}

}  // namespace attnprobe
