#pragma once
// Host entry points of the shared CUDA kernels (exact attention): plain pointers to HOST memory in, host
// memory out; each call uploads, launches and downloads. Each estimator's own kernels have theirs in its
// folder (<name>_cuda_params.h). Row-major throughout, as on the CPU side. Every function throws
// std::runtime_error with the CUDA error text on failure.
#include <cstdint>

namespace attnprobe::gpu {

/// How exact attention computes on the device.
enum class AttentionPrecision {
  kFp64,    ///< CUDA cores, one warp per row, float64 accumulation (the reference mode)
  kFp32,    ///< the same kernel in float32
  kTf32x3,  ///< tensor cores, each product split into three TF32 ones (hi·hi + hi·lo + lo·hi): fp32-level error
  kTf32,    ///< tensor cores, TF32 inputs (10-bit mantissa), fp32 accumulation (error: docs/performance.md)
};
/// "fp64", "fp32", "tf32x3", "tf32".
const char* precision_name(AttentionPrecision precision);

/// out (n × pv) = softmax(scale·Q·Kᵀ)·V, flash-style (online softmax over key tiles, never n × keys);
/// causal: key j only for query j ≤ i (needs keys == n). q: n × p, k: keys × p, v: keys × pv; p, pv ≤ 128.
void exact_attention(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                     float scale, AttentionPrecision precision, bool causal, float* out);

/// The keys a query row at position t sees: all (full), 0..t (causal) or t−W+1..t (window) — view/mask.h's
/// Mask, which the kernels' C++17 cannot include.
enum class KeyMask { kFull, kCausal, kWindow };

/// Exact attention of `rows` query rows at absolute `positions` (host array, rows entries; several heads of
/// one kv group may repeat positions) against `keys` keys at positions 0..keys−1, under `mask` (`window`: W
/// of KeyMask::kWindow): out (rows × pv). The cache is split over blocks and merged in log space
/// (decode_attention.cu); fp64: float64 accumulation, the reference mode. q: rows × p, k: keys × p,
/// v: keys × pv; p, pv ≤ 128; every position < keys.
void decode_attention(const float* q, const int64_t* positions, const float* k, const float* v, int64_t rows,
                      int64_t keys, int64_t p, int64_t pv, float scale, KeyMask mask, int64_t window, bool fp64,
                      float* out);

/// Benchmark and test only: rows per warp of the float32 decode kernel (4, 8 or 16) and the fewest keys a
/// block of it takes; 0 restores the defaults (decode_attention.cu).
void set_decode_tuning(int rows_per_warp, int64_t min_split_keys);

}  // namespace attnprobe::gpu
