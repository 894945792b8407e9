#pragma once
// A fixed pool of worker threads with one operation: parallel_for over [0, count).
// Work items are claimed dynamically, so results must never depend on which thread ran an
// item: every caller writes item i's result to slot i, and randomness is keyed by the item's
// logical index (docs/randomness.md, "Guarantees"). That is what makes `--threads 1` and `--threads 2` identical.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace attnprobe {

class ThreadPool {
 public:
  /// threads <= 0 means all hardware threads. Throws InputError (after joining the threads it did
  /// start) when the system cannot start that many.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Runs fn(i) for every i in [0, count), on the pool and the calling thread, and returns when
  /// all are done. The first exception thrown by any item is rethrown here (the rest are dropped).
  void parallel_for(int64_t count, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();
  void run_items();
  void stop_and_join();
  /// Spins for at most kSpinMicroseconds while `busy()` holds, so that the next job (for a worker) or
  /// the last item (for the caller) is usually met awake: a futex wake-up costs tens of microseconds on
  /// these VMs, as much as a parallel region of a small slice, and one estimator call has several
  /// regions back to back (key chunks, then query blocks) with serial work between them and between
  /// calls (Performer's orthogonal draw, Nyström's pseudo-inverse, merges: 50–200 µs). 1 ms, not the
  /// 50 µs it was: a worker that had gone to sleep during that serial work was woken late at the next
  /// region. `attnprobe bench --threads 1,2`, one Zen 5 VM, t1/t2 at n = 4096 with a 50 / 200 / 1000 µs
  /// spin: performer 1.51 / 1.77 / 1.82, lara 1.60 / 1.83 / 1.87, nystrom 1.63 / 1.81 / 1.88, vmean
  /// 1.19 / 1.65 / 1.72. The cost is a core kept busy for at most 1 ms after a job ends (OpenMP
  /// runtimes spin for 0.2–200 ms by default).
  template <typename Busy>
  static void spin_while(const Busy& busy);
  static constexpr int kSpinMicroseconds = 1000;

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t job_count_ = 0;
  int64_t next_item_ = 0;
  // Written under mutex_; atomic so that spin_while can read them without it.
  std::atomic<int64_t> finished_items_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_workers_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

/// fn(i) for every i in [0, count): on `pool` when there is one (and more than one thread and item),
/// else in order on the calling thread. The one switch every "pool or no pool" caller goes through.
void for_each_index(ThreadPool* pool, int64_t count, const std::function<void(int64_t)>& fn);

/// A sum over rows [0, rows) whose bits do not depend on the thread count: the rows are cut into 8 fixed
/// contiguous groups (a function of `rows` only), add(begin, end, part) accumulates each group into its own
/// copy of `zero` on the pool, and the parts are added in group order. For the float64 statistics that
/// sum every row of a slice (column sums, Gram matrices, feature–value products).
template <typename Part>
Part sum_row_groups(ThreadPool* pool, int64_t rows, const Part& zero,
                    const std::function<void(int64_t begin, int64_t end, Part& part)>& add) {
  constexpr int64_t kGroups = 8;
  const int64_t group_rows = (rows + kGroups - 1) / kGroups;
  std::vector<Part> parts(kGroups, zero);
  for_each_index(pool, kGroups, [&](int64_t g) {
    const int64_t begin = std::min(rows, g * group_rows), end = std::min(rows, begin + group_rows);
    if (begin < end) add(begin, end, parts[g]);
  });
  Part total = zero;
  for (const Part& part : parts) total += part;
  return total;
}

/// Number of hardware threads (at least 1).
int hardware_threads();

/// The thread count a `--threads` value means: itself, or every hardware thread for 0 (or less).
inline int resolve_threads(int threads) { return threads > 0 ? threads : hardware_threads(); }

/// The largest `--threads` accepted: more threads than this only add contention, and a count
/// the system cannot start must be refused up front (exit 2), not found out mid-run.
constexpr int kMaxThreads = 1024;

}  // namespace attnprobe
