// YOSO-E on the GPU (mirrors yoso_e.cpp): the expectation, one warp per query row.
#include <algorithm>
#include <cmath>
#include <string>

#include "attnprobe/estimators/yoso/yoso_e/yoso_e_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/warp_rows.cuh"

namespace attnprobe::gpu {

namespace {

// YOSO-E, one warp per query row (the layout of exact_attention.cu's CUDA-core kernel): lane j forms
// the weight (1 − acos(q̂_i·k̂_j)/π)^τ of the tile's key j, lane c accumulates output columns c,
// c + 32, ... over the tile's keys in order (so each column sums its keys in sequence, as the old
// one-thread-per-row kernel did), then the row is ℓ2-normalised by a warp reduction. D ≥ max(p, pv),
// a multiple of 32 (input=lift hashes p + 2 dimensions, so 160 covers p = 128).
template <int D>
__global__ void __launch_bounds__(kWarpRows * 32)
    yoso_expectation_kernel(const float* q_hat, const float* k_hat, const float* v, int n, int keys, int p, int pv,
                            int tau, bool causal, float* out) {
  constexpr int kCols = D / 32;  // output columns per lane
  __shared__ WarpRowTiles<D> tiles;
  __shared__ float weights[kWarpRows][kWarpRowKeys];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * kWarpRows, i = row0 + warp;
  tiles.stage_queries(q_hat, row0, n, p);
  float acc[kCols];
#pragma unroll
  for (int s = 0; s < kCols; ++s) acc[s] = 0;
  const int key_end = causal ? min(keys, min(n, row0 + kWarpRows)) : keys;  // causal: W_ij = 0 for j > i
  for (int t0 = 0; t0 < key_end; t0 += kWarpRowKeys) {
    __syncthreads();  // the previous tile is consumed (and, the first time, q̂ is staged)
    tiles.stage_keys(k_hat, v, t0, keys, p, pv);
    __syncthreads();
    const int key = t0 + lane;
    const float cosine =
        fminf(1.0f, fmaxf(-1.0f, tiles.template dot<float>(warp, lane)));  // clamp before acos: q̂·q̂ can round above 1
    const float base = 1.0f - acosf(cosine) * 0.318309886183790671538f;
    float weight = 1.0f;
    for (int t = 0; t < tau; ++t) weight *= base;
    weights[warp][lane] = key < keys && (!causal || key <= i) ? weight : 0.0f;
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < kWarpRowKeys; ++j) {
      const float w = weights[warp][j];
#pragma unroll
      for (int s = 0; s < kCols; ++s) acc[s] += w * tiles.values[j * D + lane + 32 * s];
    }
    __syncwarp();  // the weights are read before the next tile overwrites them
  }
  float squares = 0;  // columns past pv hold 0 (zero-padded values)
#pragma unroll
  for (int s = 0; s < kCols; ++s) squares += acc[s] * acc[s];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  const float norm = sqrtf(squares);
  if (i < n)
#pragma unroll
    for (int s = 0; s < kCols; ++s)
      if (lane + 32 * s < pv) out[static_cast<int64_t>(i) * pv + lane + 32 * s] = norm > 0 ? acc[s] / norm : 0.0f;
}

}  // namespace

void yoso_expectation_cuda(const YosoExpectationCudaParams& params) {
  const float *q_hat = params.q_hat, *k_hat = params.k_hat, *v = params.v;
  const int64_t n = params.n, keys = params.keys, p = params.p, pv = params.pv;
  const int tau = params.tau;
  const bool causal = params.causal;
  const int64_t d = std::max(p, pv);
  if (d > 160)
    throw InputError("CUDA yoso-e supports query, key and value dims up to 160 (got " + std::to_string(p) + ", " +
                     std::to_string(pv) + "); use --device cpu");
  DeviceBuffer<float> dq(q_hat, n * p), dk(k_hat, keys * p), dv(v, keys * pv), dout(n * pv);
  const int ni = static_cast<int>(n), ki = static_cast<int>(keys), pi = static_cast<int>(p), pvi = static_cast<int>(pv);
  const int blocks = blocks_for(n, kWarpRows), threads = kWarpRows * 32;
  if (d <= 64)
    yoso_expectation_kernel<64>
        <<<blocks, threads>>>(dq.get(), dk.get(), dv.get(), ni, ki, pi, pvi, tau, causal, dout.get());
  else if (d <= 128)
    yoso_expectation_kernel<128>
        <<<blocks, threads>>>(dq.get(), dk.get(), dv.get(), ni, ki, pi, pvi, tau, causal, dout.get());
  else
    yoso_expectation_kernel<160>
        <<<blocks, threads>>>(dq.get(), dk.get(), dv.get(), ni, ki, pi, pvi, tau, causal, dout.get());
  check_launch("yoso_expectation_kernel");
  dout.download(params.out);
}

}  // namespace attnprobe::gpu
