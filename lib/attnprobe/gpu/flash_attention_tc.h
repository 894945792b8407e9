#pragma once
// The tensor-core exact-attention launcher (flash_attention_tc.cu), behind exact_attention_device.
#include <cuda_runtime.h>

#include <cstdint>

#include "attnprobe/gpu/device_kernels.h"

namespace attnprobe::gpu {

/// Device pointers: q n × p, k keys × p, v keys × pv, out n × pv; p, pv ≤ 128. split3: 3×TF32
/// (fp32-level error), else TF32. causal needs keys == n.
void flash_attention_tc(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                        float scale, bool causal, bool split3, Scratch& scratch, float* out, cudaStream_t stream);

/// Benchmarks only: the tile shape of the next non-causal TF32 launches (warps, 16-row tiles per
/// warp, keys per tile); 0, 0, 0 restores the defaults. Shapes without a compiled kernel throw.
void set_flash_tiles(int warps, int m_tiles, int block_n);

}  // namespace attnprobe::gpu
