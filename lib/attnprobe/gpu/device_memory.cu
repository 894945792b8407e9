// The per-thread pool behind DeviceBuffer (cuda_check.cuh). Each estimator call used to cudaMalloc
// and cudaFree every buffer it uploads (up to 7 for linformer); cudaFree also waits for the whole
// device. Blocks a thread releases are kept, by size, for its next buffers: a sweep's calls on one
// slice shape reuse the same blocks. The pool keeps at most kKeptBytes per thread (larger releases
// are freed), and an allocation that finds the device full frees the pool and tries once more.
#include <cuda_runtime.h>

#include <map>

#include "attnprobe/gpu/cuda_check.cuh"

namespace attnprobe::gpu {
namespace {

constexpr size_t kKeptBytes = size_t{1} << 30;  // per thread: a 65536 × 128 slice is 32 MiB per matrix

class DevicePool {
 public:
  ~DevicePool() { release_all(); }  // at thread exit (errors ignored: the runtime may be gone at process exit)

  void* acquire(size_t bytes) {
    // A kept block at most twice the request (a larger one would hold memory a later call needs).
    if (auto it = kept_.lower_bound(bytes); it != kept_.end() && it->first <= 2 * bytes) {
      void* data = it->second;
      kept_bytes_ -= it->first;
      kept_.erase(it);
      return data;
    }
    void* data = nullptr;
    cudaError_t status = cudaMalloc(&data, bytes);
    if (status == cudaErrorMemoryAllocation && !kept_.empty()) {
      (void)cudaGetLastError();  // clear the recorded error before retrying
      release_all();
      status = cudaMalloc(&data, bytes);
    }
    check_cuda(status, "cudaMalloc");
    return data;
  }

  void release(void* data, size_t bytes) {
    if (bytes > kKeptBytes) {
      cudaFree(data);
      return;
    }
    // Keep the newest blocks: make room by freeing the smallest kept ones first.
    while (kept_bytes_ + bytes > kKeptBytes) {
      cudaFree(kept_.begin()->second);
      kept_bytes_ -= kept_.begin()->first;
      kept_.erase(kept_.begin());
    }
    kept_.emplace(bytes, data);
    kept_bytes_ += bytes;
  }

 private:
  void release_all() {
    for (const auto& [bytes, data] : kept_) cudaFree(data);
    kept_.clear();
    kept_bytes_ = 0;
  }

  std::multimap<size_t, void*> kept_;  // size → block
  size_t kept_bytes_ = 0;
};

DevicePool& pool() {
  thread_local DevicePool per_thread;
  return per_thread;
}

}  // namespace

void* acquire_device_memory(size_t bytes) { return pool().acquire(bytes); }
void release_device_memory(void* data, size_t bytes) { pool().release(data, bytes); }

}  // namespace attnprobe::gpu
