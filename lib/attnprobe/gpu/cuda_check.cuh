#pragma once
// Small device helpers shared by the kernels: error checks and RAII device buffers.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "attnprobe/common/error.h"

namespace attnprobe::gpu {

// Running out of device memory is a resource limit the user can act on (exit 3); any other CUDA
// failure is our bug (exit 4).
inline void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaErrorMemoryAllocation)
    throw InputError(std::string("CUDA ") + what + ": out of device memory; use a shorter length or --device cpu");
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(status));
}

/// Device memory from the calling thread's pool (device_memory.cu): blocks released by a thread are
/// kept for its next requests, so repeated calls skip cudaMalloc and cudaFree (which waits for the
/// device). Work queued on the legacy default stream that still uses a released block finishes
/// before anything later on that stream reuses it.
void* acquire_device_memory(size_t bytes);
void release_device_memory(void* data, size_t bytes);

/// A device array of n elements; upload() and download() copy from/to host memory.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_) data_ = static_cast<T*>(acquire_device_memory(count_ * sizeof(T)));
  }
  DeviceBuffer(const T* host, size_t count) : DeviceBuffer(count) { upload(host); }
  ~DeviceBuffer() {
    if (data_) release_device_memory(data_, count_ * sizeof(T));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  void upload(const T* host) {
    check_cuda(cudaMemcpy(data_, host, count_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  void download(T* host) const {
    check_cuda(cudaMemcpy(host, data_, count_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
  }
  void zero() { check_cuda(cudaMemset(data_, 0, count_ * sizeof(T)), "memset"); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
  check_cuda(cudaDeviceSynchronize(), kernel);
}

inline int blocks_for(int64_t items, int threads) { return static_cast<int>((items + threads - 1) / threads); }

}  // namespace attnprobe::gpu
