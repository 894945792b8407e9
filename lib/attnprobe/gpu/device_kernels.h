#pragma once
// Device-pointer entry points of the CUDA kernels, for callers that keep their data on the GPU
// (the kernel benchmark apps/gpu_bench, later whole sweeps). kernels.h wraps these for host
// pointers. Row-major throughout; every pointer here is DEVICE memory; launches go to `stream` and
// are not synchronised (errors of the launch itself throw std::runtime_error).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attnprobe/gpu/kernels.h"

namespace attnprobe::gpu {

/// A grow-only device scratch area (padded copies, split partials), kept between calls so a
/// timed loop does not allocate.
class Scratch {
 public:
  Scratch() = default;
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  /// At least `bytes` of device memory (reallocates when larger than what it holds; old contents lost).
  void* get(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

/// out (n × pv) = softmax(scale·Q·Kᵀ [+ causal mask: key j ≤ query i])·V.
/// q: n × p, k: keys × p, v: keys × pv (device); p, pv ≤ 128. Tensor-core modes pad Q, K and V into
/// `scratch` (head dim to 64 or 128, rows to the tile) and may split the keys over several blocks
/// per row tile (partials combined by a second kernel) when there are too few row tiles to fill the GPU.
void exact_attention_device(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p,
                            int64_t pv, float scale, bool causal, AttentionPrecision precision, Scratch& scratch,
                            float* out, cudaStream_t stream = nullptr);

/// decode_attention (kernels.h) on device arrays (`positions` too); `scratch` holds the splits' partials.
void decode_attention_device(const float* q, const int64_t* positions, const float* k, const float* v, int64_t rows,
                             int64_t keys, int64_t p, int64_t pv, float scale, KeyMask mask, int64_t window, bool fp64,
                             Scratch& scratch, float* out, cudaStream_t stream = nullptr);

/// Reads every float of `data` (count floats, a multiple of 4, 16-byte aligned) once: the read-bandwidth
/// ceiling of kernels that read their inputs once (apps/gpu_bench). `scratch` holds per-block sums.
void read_all_device(const float* data, int64_t count, Scratch& scratch, cudaStream_t stream = nullptr);

/// out (n × pv): every row the column mean of v (keys × pv), accumulated in double.
/// `scratch` holds the per-block partial sums.
void vmean_device(const float* v, int64_t n, int64_t keys, int64_t pv, Scratch& scratch, float* out,
                  cudaStream_t stream = nullptr);
/// The causal form: out row i = the mean of v's rows 0..i (v: n × pv), running sums in double.
void vmean_causal_device(const float* v, int64_t n, int64_t pv, Scratch& scratch, float* out,
                         cudaStream_t stream = nullptr);

/// performer (kernels.h) on device arrays: q_scaled n × p, k_scaled keys × p, v keys × pv, omegas
/// features × p (float64), out n × pv. `scratch` holds the features and the key summary.
void performer_device(const double* q_scaled, const double* k_scaled, const double* v, const double* omegas, int64_t n,
                      int64_t keys, int64_t p, int64_t pv, int64_t features, Scratch& scratch, float* out,
                      cudaStream_t stream = nullptr);
/// Its causal form (n × n, pv ≤ 128): chunk sums, their prefix, then each row from its chunk's prefix
/// and the chunk's keys up to itself.
void performer_causal_device(const double* q_scaled, const double* k_scaled, const double* v, const double* omegas,
                             int64_t n, int64_t p, int64_t pv, int64_t features, Scratch& scratch, float* out,
                             cudaStream_t stream = nullptr);

}  // namespace attnprobe::gpu
