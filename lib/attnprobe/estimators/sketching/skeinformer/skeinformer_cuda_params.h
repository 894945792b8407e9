#pragma once
// The CUDA version of skeinformer (skeinformer.cu), for its host adapter (skeinformer_cuda.cpp): plain host
// pointers, row-major.
#include <cstdint>

namespace attnprobe::gpu {

/// The row normalisation (the kernel's mode numbers).
enum class SketchRowNorm : int { kAdaptive = 0, kSimple = 1, kExact = 2 };

struct SkeinformerCudaParams {
  const float* q = nullptr;                       ///< n × p
  const float* k = nullptr;                       ///< keys × p, read only with kExact (its denominator over all keys)
  const float* k_sel = nullptr;                   ///< s × p: the sampled columns' keys
  const float* v_sel = nullptr;                   ///< s × pv: their values
  const float* v_missing = nullptr;               ///< pv: Σ_j v_j − Σ_{c∈J′} v_c
  int64_t n = 0, keys = 0, s = 0, p = 0, pv = 0;  ///< pv ≤ 128
  float scale = 0;
  SketchRowNorm mode = SketchRowNorm::kAdaptive;
  float* out = nullptr;  ///< n × pv (host), before step 6 (pilot reuse, on the host)
};

void skeinformer_cuda(const SkeinformerCudaParams& params);

}  // namespace attnprobe::gpu
