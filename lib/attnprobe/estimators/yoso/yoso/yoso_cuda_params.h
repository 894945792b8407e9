#pragma once
// The CUDA version of yoso (yoso.cu, with the hash codes of ../lsh_cuda.h), for its host adapter
// (yoso_cuda.cpp): plain host pointers, row-major.
#include <cstdint>

namespace attnprobe::gpu {

struct YosoTablesCudaParams {
  const uint32_t* query_codes = nullptr;  ///< n × m
  const uint32_t* key_codes = nullptr;    ///< keys × m
  const float* v = nullptr;               ///< keys × pv
  int64_t n = 0, keys = 0, pv = 0;
  int m = 32, tau = 8;
  /// n × pv (host): y_i = (1/m)·Σ_f T_f[query_codes(i, f)], T_f[c] = Σ_{j: key_codes(j, f) = c} v_j (float atomics:
  /// sums in a nondeterministic order, within float rounding of the CPU)
  float* y = nullptr;
};

void yoso_tables_cuda(const YosoTablesCudaParams& params);

}  // namespace attnprobe::gpu
