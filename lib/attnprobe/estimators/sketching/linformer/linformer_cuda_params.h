#pragma once
// The CUDA version of linformer (linformer.cu), for its host adapter (linformer_cuda.cpp): plain host
// pointers, row-major.
#include <cstdint>

namespace attnprobe::gpu {

struct LinformerCudaParams {
  const float* q = nullptr;  ///< n × p
  const float* k = nullptr;  ///< keys × p
  const float* v = nullptr;  ///< keys × pv
  const float* e = nullptr;  ///< d × keys: the projection E (gaussian_matrix, the CPU's draws)
  int64_t n = 0, keys = 0, p = 0, pv = 0, d = 0;
  float scale = 0;
  float* out = nullptr;  ///< n × pv (host)
};

void linformer_cuda(const LinformerCudaParams& params);

}  // namespace attnprobe::gpu
