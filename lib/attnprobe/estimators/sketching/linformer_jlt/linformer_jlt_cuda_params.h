#pragma once
// The CUDA version of linformer-jlt (linformer_jlt.cu), for its host adapter (linformer_jlt_cuda.cpp): plain
// host pointers, row-major.
#include <cstdint>

namespace attnprobe::gpu {

struct LinformerJltCudaParams {
  const float* q = nullptr;  ///< n × p
  const float* k = nullptr;  ///< keys × p
  const float* v = nullptr;  ///< keys × pv
  const float* s = nullptr;  ///< keys × d: the sketch S (gaussian_matrix, the CPU's draws)
  int64_t n = 0, keys = 0, p = 0, pv = 0, d = 0;
  float scale = 0;
  float* out = nullptr;  ///< n × pv (host)
};

void linformer_jlt_cuda(const LinformerJltCudaParams& params);

}  // namespace attnprobe::gpu
