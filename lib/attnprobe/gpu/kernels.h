#pragma once
// Host entry points of the CUDA kernels: plain pointers to HOST memory in, host memory out; each
// call uploads, launches and downloads (so nvcc never sees Eigen, and the estimators in
// estimators.cpp stay ordinary C++). Row-major throughout, as on the CPU side. Every function
// throws std::runtime_error with the CUDA error text on failure.
#include <cstdint>

#include "attnprobe/rng/random_stream.h"

namespace attnprobe::gpu {

/// How exact attention computes on the device.
enum class AttentionPrecision {
  kFp64,    ///< CUDA cores, one warp per row, float64 accumulation (the reference mode)
  kFp32,    ///< the same kernel in float32
  kTf32x3,  ///< tensor cores, each product split into three TF32 ones (hi·hi + hi·lo + lo·hi): fp32-level error
  kTf32,    ///< tensor cores, TF32 inputs (10-bit mantissa), fp32 accumulation (error: PERF.md)
};
/// "fp64", "fp32", "tf32x3", "tf32".
const char* precision_name(AttentionPrecision precision);

/// out (n × pv) = softmax(scale·Q·Kᵀ)·V, flash-style (online softmax over key tiles, never n × keys);
/// causal: key j only for query j ≤ i (needs keys == n). q: n × p, k: keys × p, v: keys × pv; p, pv ≤ 128.
void exact_attention(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                     float scale, AttentionPrecision precision, bool causal, float* out);

/// out (n × pv): every row the column mean of v (keys × pv), accumulated in double; causal (keys ==
/// n): row i the mean of rows 0..i.
void vmean(const float* v, int64_t n, int64_t keys, int64_t pv, bool causal, float* out);

/// YOSO-E: out_i = ℓ2(Σ_j (1 − acos(clamp(q̂_i·k̂_j))/π)^τ v_j) for ℓ2-normalised rows q̂, k̂;
/// causal: keys j ≤ i only.
void yoso_expectation(const float* q_hat, const float* k_hat, const float* v, int64_t n, int64_t keys, int64_t p,
                      int64_t pv, int tau, bool causal, float* out);

/// The codes of estimators/yoso/lsh.h, on the device: codes[i·m + f] for rows of x (n × p, float64).
void lsh_codes(const double* x, int64_t n, int64_t p, int m, int tau, bool hadamard, RandomKey key, uint32_t* codes);

/// y (n × pv) = (1/m)·Σ_f T_f[query_codes(i, f)] with T_f[c] = Σ_{j: key_codes(j, f) = c} v_j (float
/// atomics: sums in a nondeterministic order, within float rounding of the CPU).
void yoso_tables(const uint32_t* query_codes, const uint32_t* key_codes, const float* v, int64_t n, int64_t keys,
                 int64_t pv, int m, int tau, float* y);

/// Performer with the given features ω (features × p) in float64: the ratio of (shifted) positive
/// feature products, as estimators/random_features/performer.cpp. q_scaled, k_scaled: √s·Q, √s·K.
/// causal (keys == n, pv ≤ 128): its causal form, row i from keys 0..i under running maxima.
void performer(const double* q_scaled, const double* k_scaled, const double* v, const double* omegas, int64_t n,
               int64_t keys, int64_t p, int64_t pv, int64_t features, bool causal, float* out);

}  // namespace attnprobe::gpu
