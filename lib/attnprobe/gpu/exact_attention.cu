// Exact attention on the GPU (mirrors exact/exact_attention.cpp), in four precisions
// (AttentionPrecision): the tensor-core kernels of flash_attention_tc.cu (TF32, and 3×TF32 for
// fp32-level error), and here the CUDA-core kernel: one warp per query row, keys in tiles of 32
// (one per lane: each lane forms its key's logit), online softmax per tile (running max m, sum l,
// output rescaled by exp(m_old − m_new)), so the n × keys matrix is never formed. Acc = double is
// the fp64-accumulation reference mode (`sweep --device cuda`'s reference), Acc = float the fp32 one.
// Before (docs/history/gpu-runs.md, runs 10 and 11) it was one thread per row with its query and output in
// local memory: 32 blocks at n = 4096 for 132 SMs left most of the GPU idle.
#include <algorithm>
#include <cmath>

#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/flash_attention_tc.h"
#include "attnprobe/gpu/kernels.h"
#include "attnprobe/gpu/warp_rows.cuh"

namespace attnprobe::gpu {

namespace {
constexpr int kMaxDim = 128;  // head dims the kernels take

// out (n × pv) = softmax(scale·q·kᵀ [causal: keys j ≤ i])·v with D ≥ max(p, pv) a multiple of 32.
// Lane j of a warp forms the logit of the tile's key j (q·k over D columns, accumulated in Acc, then
// scaled in Acc), the warp takes the tile's max and sum by shuffles, and lane c accumulates output
// columns c, c + 32, ... from the staged values with the lanes' weights read back from shared memory.
template <typename Acc, int D>
__global__ void __launch_bounds__(kWarpRows * 32)
    warp_row_attention_kernel(const float* q, const float* k, const float* v, int n, int keys, int p, int pv,
                              float scale, bool causal, float* out) {
  constexpr int kCols = D / 32;  // output columns per lane
  __shared__ WarpRowTiles<D> tiles;
  __shared__ Acc weights[kWarpRows][kWarpRowKeys];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * kWarpRows, i = row0 + warp;
  tiles.stage_queries(q, row0, n, p);
  Acc acc[kCols];
#pragma unroll
  for (int s = 0; s < kCols; ++s) acc[s] = 0;
  Acc running_max = -INFINITY, running_sum = 0;
  const int key_end = causal ? min(keys, min(n, row0 + kWarpRows)) : keys;  // causal: the block's last row
  for (int t0 = 0; t0 < key_end; t0 += kWarpRowKeys) {
    __syncthreads();  // the previous tile is consumed (and, the first time, q is staged)
    tiles.stage_keys(k, v, t0, keys, p, pv);
    __syncthreads();
    const int key = t0 + lane;
    const bool valid = key < keys && (!causal || key <= i);
    const Acc logit =
        valid ? tiles.template dot<Acc>(warp, lane) * static_cast<Acc>(scale) : static_cast<Acc>(-INFINITY);
    Acc tile_max = logit;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      tile_max = max(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
    const Acc new_max = max(running_max, tile_max);
    // Key 0 is valid for every row, so new_max is finite from the first tile on; the guard keeps a
    // fully masked tile from computing −inf − (−inf).
    const Acc shift = new_max == static_cast<Acc>(-INFINITY) ? static_cast<Acc>(0) : new_max;
    const Acc weight = valid ? exp(logit - shift) : static_cast<Acc>(0);
    Acc tile_sum = weight;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
    const Acc correction = exp(running_max - shift);  // 0 on the first tile
    running_sum = running_sum * correction + tile_sum;
    running_max = new_max;
    weights[warp][lane] = weight;
    __syncwarp();
#pragma unroll
    for (int s = 0; s < kCols; ++s) acc[s] *= correction;
#pragma unroll 8
    for (int j = 0; j < kWarpRowKeys; ++j) {
      const Acc w = weights[warp][j];
#pragma unroll
      for (int s = 0; s < kCols; ++s) acc[s] += w * static_cast<Acc>(tiles.values[j * D + lane + 32 * s]);
    }
    __syncwarp();  // the weights are read before the next tile overwrites them
  }
  if (i < n)
#pragma unroll
    for (int s = 0; s < kCols; ++s)
      if (lane + 32 * s < pv)
        out[static_cast<int64_t>(i) * pv + lane + 32 * s] = static_cast<float>(acc[s] / running_sum);
}

template <typename Acc>
void launch_warp_rows(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                      float scale, bool causal, float* out, cudaStream_t stream) {
  const int ni = static_cast<int>(n), ki = static_cast<int>(keys), pi = static_cast<int>(p), pvi = static_cast<int>(pv);
  if (std::max(p, pv) <= 64)
    warp_row_attention_kernel<Acc, 64>
        <<<blocks_for(n, kWarpRows), kWarpRows * 32, 0, stream>>>(q, k, v, ni, ki, pi, pvi, scale, causal, out);
  else
    warp_row_attention_kernel<Acc, 128>
        <<<blocks_for(n, kWarpRows), kWarpRows * 32, 0, stream>>>(q, k, v, ni, ki, pi, pvi, scale, causal, out);
}
}  // namespace

const char* precision_name(AttentionPrecision precision) {
  switch (precision) {
    case AttentionPrecision::kFp64:
      return "fp64";
    case AttentionPrecision::kFp32:
      return "fp32";
    case AttentionPrecision::kTf32x3:
      return "tf32x3";
    case AttentionPrecision::kTf32:
      return "tf32";
  }
  return "?";
}

Scratch::~Scratch() {
  if (data_) cudaFree(data_);
}

void* Scratch::get(size_t bytes) {
  if (bytes > bytes_) {
    if (data_) check_cuda(cudaFree(data_), "cudaFree");
    data_ = nullptr;
    bytes_ = 0;
    check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc(scratch)");
    bytes_ = bytes;
  }
  return data_;
}

void exact_attention_device(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p,
                            int64_t pv, float scale, bool causal, AttentionPrecision precision, Scratch& scratch,
                            float* out, cudaStream_t stream) {
  if (p > kMaxDim || pv > kMaxDim)
    throw InputError("CUDA exact attention supports head dims up to 128 (got " + std::to_string(p) + ", " +
                     std::to_string(pv) + ")");
  if (causal && keys != n) throw std::runtime_error("causal attention needs as many keys as queries");
  if (precision == AttentionPrecision::kTf32 || precision == AttentionPrecision::kTf32x3) {
    flash_attention_tc(q, k, v, n, keys, p, pv, scale, causal, precision == AttentionPrecision::kTf32x3, scratch, out,
                       stream);
    return;
  }
  if (precision == AttentionPrecision::kFp64)
    launch_warp_rows<double>(q, k, v, n, keys, p, pv, scale, causal, out, stream);
  else
    launch_warp_rows<float>(q, k, v, n, keys, p, pv, scale, causal, out, stream);
  check_cuda(cudaGetLastError(), "warp_row_attention_kernel");
}

void exact_attention(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                     float scale, AttentionPrecision precision, bool causal, float* out) {
  DeviceBuffer<float> dq(q, n * p), dk(k, keys * p), dv(v, keys * pv), dout(n * pv);
  thread_local Scratch scratch;  // kept between calls (padded copies, split partials); one per calling thread
  exact_attention_device(dq.get(), dk.get(), dv.get(), n, keys, p, pv, scale, causal, precision, scratch, dout.get(),
                         nullptr);
  check_launch("exact_attention");
  dout.download(out);
}

}  // namespace attnprobe::gpu
