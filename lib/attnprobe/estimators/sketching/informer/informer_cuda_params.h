#pragma once
// The CUDA version of informer (informer.cu), for its host adapter (informer_cuda.cpp): plain host
// pointers, row-major.
#include <cstdint>

namespace attnprobe::gpu {

struct InformerCudaParams {
  const float* q = nullptr;         ///< n × p
  const float* k = nullptr;         ///< keys × p
  const float* v = nullptr;         ///< keys × pv
  const int32_t* active = nullptr;  ///< u rows that get their exact softmax row (informer_active_rows)
  int64_t u = 0, n = 0, keys = 0, p = 0, pv = 0;
  float scale = 0;
  float* out = nullptr;  ///< n × pv (host): exact rows `active`, mean(V) elsewhere
};

void informer_cuda(const InformerCudaParams& params);

}  // namespace attnprobe::gpu
