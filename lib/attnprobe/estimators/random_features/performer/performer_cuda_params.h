#pragma once
// The CUDA version of performer (performer.cu), for its host adapter (performer_cuda.cpp): plain host
// pointers, row-major, float64 inputs. The device-pointer entry points are in gpu/device_kernels.h.
#include <cstdint>

namespace attnprobe::gpu {

struct PerformerCudaParams {
  const double* q_scaled = nullptr;  ///< n × p: √s·Q
  const double* k_scaled = nullptr;  ///< keys × p: √s·K
  const double* v = nullptr;         ///< keys × pv
  const double* omegas = nullptr;    ///< features × p: the random features ω (drawn on the host)
  int64_t n = 0, keys = 0, p = 0, pv = 0, features = 0;
  bool causal = false;   ///< the causal form (keys == n, pv ≤ 128): row i from keys 0..i under running maxima
  float* out = nullptr;  ///< n × pv (host)
};

/// The ratio of (shifted) positive feature products, as performer.cpp; uploads, computes, downloads.
void performer_cuda(const PerformerCudaParams& params);

}  // namespace attnprobe::gpu
