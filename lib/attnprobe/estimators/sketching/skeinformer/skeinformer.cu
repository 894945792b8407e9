// Skeinformer on the GPU (mirrors skeinformer.cpp): steps 4-5 of Algorithm 1 for every row, from the
// sampled columns the host adapter chose (skeinformer_cuda.cpp): logits against the |J′| sampled keys (float64
// dot products, O(n·|J′|·p)), the per-row shift, the adaptive (or simple) row normalisation and the product
// with V_J′ (O(n·|J′|·pv)); rownorm=exact adds the exact denominator over all keys (O(n²·p), two passes per row).
#include <algorithm>
#include <cmath>
#include <vector>

#include "attnprobe/estimators/sketching/skeinformer/skeinformer_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/sketch_kernels.cuh"

namespace attnprobe::gpu {
namespace {

constexpr int kRowThreads = 128;  // one block per query row; thread c owns output column c (pv ≤ 128)

// logits (n × s) = scale · Q · K_selᵀ with Q: n × p, K_sel: s × p; float64 dot products, rounded once.
// Grid: x over the s columns, y over rows (strided past 65535).
__global__ void sampled_logits_kernel(const float* q, const float* k_sel, int64_t n, int s, int p, float scale,
                                      float* logits) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= s) return;
  const float* kj = k_sel + static_cast<int64_t>(j) * p;
  for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {  // gridDim.y is at most 65535
    const float* qi = q + i * p;
    double dot = 0;
    for (int c = 0; c < p; ++c) dot += static_cast<double>(qi[c]) * static_cast<double>(kj[c]);
    logits[i * s + j] = scale * static_cast<float>(dot);
  }
}

// Block-wide reduction over kRowThreads values (max or sum); every thread gets the result.
__device__ double block_reduce(double value, bool take_max, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kRowThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      shared[threadIdx.x] = take_max ? fmax(shared[threadIdx.x], shared[threadIdx.x + half])
                                     : shared[threadIdx.x] + shared[threadIdx.x + half];
    __syncthreads();
  }
  const double result = shared[0];
  __syncthreads();
  return result;
}

// One block per row i. logits: n × s, v_sel: s × pv, v_missing: pv (Σ_j v_j − Σ_{c∈J′} v_c),
// out: n × pv. mode 0 adaptive: (R′_i + g_i·v_missing) / (S_i + unselected·g_i); 1 simple: R′_i / S_i;
// 2 exact: R′_i / D_ii, with a_ic shifted by the full row max and D_ii over all keys (q, k: n × p).
__global__ void sketch_rows_kernel(const float* logits, int s, const float* v_sel, const float* v_missing,
                                   float unselected, int mode, const float* q, const float* k, int keys, int p,
                                   float scale, int pv, float* out) {
  __shared__ double reduce[kRowThreads];
  const int64_t i = blockIdx.x;
  const float* row = logits + i * s;
  const int c = threadIdx.x;
  float shift;
  double denominator = 0, g = 0;
  if (mode == 2) {
    // The full row's max and Σ exp(logit − max), each thread over keys t, t + 128, ... (O(n·p) twice).
    const float* qi = q + i * p;
    double local = -INFINITY;
    for (int j = threadIdx.x; j < keys; j += kRowThreads) {
      double dot = 0;
      for (int t = 0; t < p; ++t) dot += static_cast<double>(qi[t]) * static_cast<double>(k[int64_t{j} * p + t]);
      local = fmax(local, static_cast<double>(scale * static_cast<float>(dot)));
    }
    shift = static_cast<float>(block_reduce(local, true, reduce));
    local = 0;
    for (int j = threadIdx.x; j < keys; j += kRowThreads) {
      double dot = 0;
      for (int t = 0; t < p; ++t) dot += static_cast<double>(qi[t]) * static_cast<double>(k[int64_t{j} * p + t]);
      local += expf(scale * static_cast<float>(dot) - shift);
    }
    denominator = block_reduce(local, false, reduce);
  } else {
    // Every thread reads the s logits itself (s is the sketch size): max, mean and Σ exp.
    shift = -INFINITY;
    double sum = 0;
    for (int j = 0; j < s; ++j) {
      shift = fmaxf(shift, row[j]);
      sum += row[j];
    }
    const float log_g = static_cast<float>(sum / s) - shift;  // log of the geometric mean of a_ic
    for (int j = 0; j < s; ++j) denominator += expf(row[j] - shift);
    g = mode == 0 ? expf(log_g) : 0;
  }
  if (c >= pv) return;
  double r = 0;
  for (int j = 0; j < s; ++j) r += static_cast<double>(expf(row[j] - shift)) * v_sel[int64_t{j} * pv + c];
  if (mode == 0)
    out[i * pv + c] = static_cast<float>((r + g * v_missing[c]) / (denominator + unselected * g));
  else
    out[i * pv + c] = static_cast<float>(r / denominator);
}

}  // namespace

void skeinformer_cuda(const SkeinformerCudaParams& params) {
  const int64_t n = params.n, keys = params.keys, p = params.p, pv = params.pv, s = params.s;
  if (pv > kRowThreads) throw InputError("CUDA skeinformer supports value dims up to 128");
  const bool exact = params.mode == SketchRowNorm::kExact;
  DeviceBuffer<float> dq(params.q, n * p), dk_sel(params.k_sel, s * p), dv_sel(params.v_sel, s * pv),
      dmissing(params.v_missing, pv), dlogits(n * s), dout(n * pv);
  DeviceBuffer<float> dk(exact ? keys * p : 0);
  if (exact) dk.upload(params.k);
  sampled_logits_kernel<<<dim3(blocks_for(s, 128), static_cast<unsigned>(std::min<int64_t>(n, 65535))), 128>>>(
      dq.get(), dk_sel.get(), n, static_cast<int>(s), static_cast<int>(p), params.scale, dlogits.get());
  sketch_rows_kernel<<<static_cast<unsigned>(n), kRowThreads>>>(
      dlogits.get(), static_cast<int>(s), dv_sel.get(), dmissing.get(), static_cast<float>(n - s),
      static_cast<int>(params.mode), dq.get(), dk.get(), static_cast<int>(keys), static_cast<int>(p), params.scale,
      static_cast<int>(pv), dout.get());
  check_launch("skeinformer");
  dout.download(params.out);
}

}  // namespace attnprobe::gpu
