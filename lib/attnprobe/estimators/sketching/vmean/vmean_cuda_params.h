#pragma once
// The CUDA version of vmean (vmean.cu), for its host adapter (vmean_cuda.cpp): plain host pointers,
// row-major. The device-pointer entry points are in gpu/device_kernels.h.
#include <cstdint>

namespace attnprobe::gpu {

struct VMeanCudaParams {
  const float* v = nullptr;  ///< keys × pv values (host)
  int64_t n = 0;             ///< output rows
  int64_t keys = 0;
  int64_t pv = 0;
  bool causal = false;   ///< row i the mean of rows 0..i (keys == n)
  float* out = nullptr;  ///< n × pv (host): every row the column mean of v, accumulated in double
};

/// Uploads v, computes on the device, downloads out; std::runtime_error with the CUDA error text on failure.
void vmean_cuda(const VMeanCudaParams& params);

}  // namespace attnprobe::gpu
