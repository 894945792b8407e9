#pragma once
// The CUDA version of yoso-e (yoso_e.cu), for its host adapter (yoso_e_cuda.cpp): plain host pointers, row-major.
#include <cstdint>

namespace attnprobe::gpu {

struct YosoExpectationCudaParams {
  const float* q_hat = nullptr;            ///< n × p: ℓ2-normalised (or lifted) query rows
  const float* k_hat = nullptr;            ///< keys × p: the same for keys
  const float* v = nullptr;                ///< keys × pv
  int64_t n = 0, keys = 0, p = 0, pv = 0;  ///< max(p, pv) ≤ 160
  int tau = 8;
  bool causal = false;   ///< keys j ≤ i only
  float* out = nullptr;  ///< n × pv (host): out_i = ℓ2(Σ_j (1 − acos(clamp(q̂_i·k̂_j))/π)^τ v_j)
};

void yoso_expectation_cuda(const YosoExpectationCudaParams& params);

}  // namespace attnprobe::gpu
