// V-Mean on the GPU (mirrors estimators/sketching/vmean.cpp): column means in double, broadcast.
// Memory-bound: the fewest bytes are keys·pv·4 read + n·pv·4 written. Three launches: per-block
// partial column sums (32 columns × 8 row lanes per block, coalesced 128-byte row segments), their
// total, and the broadcast (one float per thread, consecutive threads on consecutive floats).
#include <algorithm>

#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/kernels.h"

namespace attnprobe::gpu {

namespace {
constexpr int kLanes = 8;           // row lanes per block (threadIdx.y)
constexpr int kRowsPerBlock = 256;  // rows each block sums

// partial (blocks × pv): partial[b][c] = Σ_{j in block b's rows} v[j][c], in double.
__global__ void column_partial_kernel(const float* v, int64_t keys, int pv, double* partial) {
  __shared__ double lane_sums[kLanes][32];
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t row_end = min(keys, row_begin + kRowsPerBlock);
  for (int c0 = 0; c0 < pv; c0 += 32) {
    const int c = c0 + threadIdx.x;
    double sum = 0;
    if (c < pv)
      for (int64_t j = row_begin + threadIdx.y; j < row_end; j += kLanes) sum += v[j * pv + c];
    lane_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < pv) {
      double total = 0;
      for (int lane = 0; lane < kLanes; ++lane) total += lane_sums[lane][threadIdx.x];
      partial[static_cast<int64_t>(blockIdx.x) * pv + c] = total;
    }
    __syncthreads();
  }
}

__global__ void column_mean_kernel(const double* partial, int blocks, int64_t keys, int pv, float* mean) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= pv) return;
  double sum = 0;
  for (int b = 0; b < blocks; ++b) sum += partial[static_cast<int64_t>(b) * pv + c];
  mean[c] = static_cast<float>(sum / keys);
}

__global__ void broadcast_kernel(const float* mean, int64_t n, int pv, float* out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx < n * pv) out[idx] = mean[idx % pv];
}
}  // namespace

void vmean_device(const float* v, int64_t n, int64_t keys, int64_t pv, Scratch& scratch, float* out,
                  cudaStream_t stream) {
  const int blocks = static_cast<int>((keys + kRowsPerBlock - 1) / kRowsPerBlock);
  auto* partial = static_cast<double*>(scratch.get((static_cast<size_t>(blocks) * pv + pv) * sizeof(double)));
  auto* mean = reinterpret_cast<float*>(partial + static_cast<size_t>(blocks) * pv);
  const int pvi = static_cast<int>(pv);
  column_partial_kernel<<<blocks, dim3(32, kLanes), 0, stream>>>(v, keys, pvi, partial);
  column_mean_kernel<<<blocks_for(pv, 64), 64, 0, stream>>>(partial, blocks, keys, pvi, mean);
  broadcast_kernel<<<blocks_for(n * pv, 256), 256, 0, stream>>>(mean, n, pvi, out);
  check_cuda(cudaGetLastError(), "vmean kernels");
}

void vmean(const float* v, int64_t n, int64_t keys, int64_t pv, float* out) {
  DeviceBuffer<float> dv(v, keys * pv), dout(n * pv);
  thread_local Scratch scratch;
  vmean_device(dv.get(), n, keys, pv, scratch, dout.get(), nullptr);
  check_launch("vmean");
  dout.download(out);
}

}  // namespace attnprobe::gpu
