#include "attnprobe/common/parallel.h"

#include <chrono>

#include "attnprobe/common/error.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace attnprobe {

void for_each_index(ThreadPool* pool, int64_t count, const std::function<void(int64_t)>& fn) {
  if (pool && pool->size() > 1 && count > 1)
    pool->parallel_for(count, fn);
  else
    for (int64_t i = 0; i < count; ++i) fn(i);
}

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int threads) {
  const int total = resolve_threads(threads);
  try {
    workers_.reserve(total > 0 ? total - 1 : 0);
    for (int i = 1; i < total; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::exception& e) {
    // A constructor that throws runs no destructor: stop and join the workers already started here,
    // or they would wait on wake_ forever (and the joinable std::threads would terminate the process).
    const size_t started = workers_.size();
    stop_and_join();
    throw InputError(fmt::format("cannot start {} worker threads ({} started: {}); use a smaller --threads", total,
                                 started + 1, e.what()));
  }
}

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() { stop_and_join(); }

template <typename Busy>
void ThreadPool::spin_while(const Busy& busy) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
  while (busy()) {
    for (int i = 0; i < 32; ++i) {
#if defined(__x86_64__)
      _mm_pause();
#endif
    }
    if (std::chrono::steady_clock::now() > deadline) return;
  }
}

void ThreadPool::run_items() {
  while (true) {
    int64_t item;
    const std::function<void(int64_t)>* job;
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_item_ >= job_count_) return;
      item = next_item_++;
      job = job_;
      failed = error_ != nullptr;  // after a failure the remaining items are skipped, not run
    }
    try {
      if (!failed) (*job)(item);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (++finished_items_ == job_count_) done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  while (true) {
    // A pool being destroyed ends the spin at once (its destructor joins this thread).
    spin_while([&] { return generation_ == seen && !stop_; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++busy_workers_;
    }
    run_items();
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_workers_ == 0) done_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t)>& fn) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_count_ = count;
    next_item_ = 0;
    finished_items_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_items();
  // Wait for every item and for every worker to have left run_items, so the next job
  // cannot be picked up by a worker still holding a pointer to this one.
  const auto all_done = [&] { return finished_items_ == job_count_ && busy_workers_ == 0; };
  spin_while([&] { return !all_done(); });
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, all_done);
    job_ = nullptr;
    job_count_ = 0;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace attnprobe
