// V-Mean on the GPU (mirrors vmean.cpp): column means in double, broadcast;
// causal: running means (chunk sums, their prefix, then each chunk's rows in order).
// Memory-bound: the fewest bytes are keys·pv·4 read + n·pv·4 written. Three launches: per-block
// partial column sums (16-byte loads when pv % 4 == 0), their total, and the broadcast (16-byte
// stores). Device pointers must be 16-byte aligned (cudaMalloc's are).
#include <algorithm>
#include <stdexcept>

#include "attnprobe/estimators/sketching/vmean/vmean_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"

namespace attnprobe::gpu {

namespace {
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 128;  // 65536 keys: 512 blocks, ~4 per SM

// partial (blocks × pv): partial[b][c] = Σ_{j in block b's rows} v[j][c], in double. Each thread
// sums one float4 of columns over rows lane, lane + lanes, ... (16-byte coalesced loads, several in
// flight); pv % 4 == 0 and pv ≤ 4·kThreads, else the scalar kernel below.
__global__ void column_partial4_kernel(const float4* v, int64_t keys, int pv4, double* partial) {
  __shared__ double sums[kThreads][4];
  const int lanes = kThreads / pv4, lane = threadIdx.x / pv4, c4 = threadIdx.x % pv4;
  double acc[4] = {0, 0, 0, 0};
  if (lane < lanes) {
    const int64_t row_end = min(keys, static_cast<int64_t>(blockIdx.x + 1) * kRowsPerBlock);
#pragma unroll 4
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + lane; j < row_end; j += lanes) {
      const float4 x = v[j * pv4 + c4];
      acc[0] += x.x;
      acc[1] += x.y;
      acc[2] += x.z;
      acc[3] += x.w;
    }
  }
  for (int e = 0; e < 4; ++e) sums[threadIdx.x][e] = acc[e];
  __syncthreads();
  if (threadIdx.x < pv4)
    for (int e = 0; e < 4; ++e) {
      double total = 0;
      for (int l = 0; l < lanes; ++l) total += sums[l * pv4 + threadIdx.x][e];
      partial[static_cast<int64_t>(blockIdx.x) * pv4 * 4 + threadIdx.x * 4 + e] = total;
    }
}

// The same for any pv: 32 columns × 8 row lanes per block.
__global__ void column_partial_kernel(const float* v, int64_t keys, int pv, double* partial) {
  __shared__ double lane_sums[8][32];
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t row_end = min(keys, row_begin + kRowsPerBlock);
  for (int c0 = 0; c0 < pv; c0 += 32) {
    const int c = c0 + threadIdx.x;
    double sum = 0;
    if (c < pv)
      for (int64_t j = row_begin + threadIdx.y; j < row_end; j += 8) sum += v[j * pv + c];
    lane_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < pv) {
      double total = 0;
      for (int lane = 0; lane < 8; ++lane) total += lane_sums[lane][threadIdx.x];
      partial[static_cast<int64_t>(blockIdx.x) * pv + c] = total;
    }
    __syncthreads();
  }
}

// mean[c] = Σ_b partial[b][c] / keys: one block per column, its threads over the partials (a
// single thread per column summing 512 partials in sequence took most of vmean's time: docs/history/gpu-runs.md, run
// 5).
__global__ void column_mean_kernel(const double* partial, int blocks, int64_t keys, int pv, float* mean) {
  __shared__ double warp_sums[kThreads / 32];
  const int c = blockIdx.x;
  double sum = 0;
  for (int b = threadIdx.x; b < blocks; b += kThreads) sum += partial[static_cast<int64_t>(b) * pv + c];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    mean[c] = static_cast<float>(total / keys);
  }
}

// out (n × pv) = the mean row, 16-byte stores (pv % 4 == 0; 32-bit index arithmetic: n·pv/4 < 2³¹).
__global__ void broadcast4_kernel(const float4* mean, int total4, int pv4, float4* out) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < total4) out[idx] = mean[idx % pv4];
}

__global__ void broadcast_kernel(const float* mean, int64_t n, int pv, float* out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx < n * pv) out[idx] = mean[idx % pv];
}

// Causal form: partial[b][c] (the chunk sums above) becomes Σ_{b' < b} partial[b'][c], the sum of
// every row before chunk b; one thread per column (≤ 512 chunks at n = 65536).
__global__ void exclusive_prefix_kernel(double* partial, int blocks, int pv) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= pv) return;
  double before = 0;
  for (int b = 0; b < blocks; ++b) {
    const double chunk = partial[static_cast<int64_t>(b) * pv + c];
    partial[static_cast<int64_t>(b) * pv + c] = before;
    before += chunk;
  }
}

// out[i][c] = (Σ_{j ≤ i} v[j][c]) / (i + 1): chunk b's rows from the sum of every row before them,
// one thread per column walking the chunk's rows in order (a running sum in double, as on the CPU).
__global__ void running_mean_kernel(const float* v, const double* before, int64_t n, int pv, float* out) {
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t row_end = min(n, row_begin + kRowsPerBlock);
  for (int c = threadIdx.x; c < pv; c += blockDim.x) {
    double sum = before[static_cast<int64_t>(blockIdx.x) * pv + c];
    for (int64_t j = row_begin; j < row_end; ++j) {
      sum += v[j * pv + c];
      out[j * pv + c] = static_cast<float>(sum / static_cast<double>(j + 1));
    }
  }
}
}  // namespace

namespace {
// partial (blocks × pv): each chunk of kRowsPerBlock rows' column sums, in double.
void chunk_sums(const float* v, int64_t keys, int pv, int blocks, bool vectors, double* partial, cudaStream_t stream) {
  if (vectors)
    column_partial4_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const float4*>(v), keys, pv / 4, partial);
  else
    column_partial_kernel<<<blocks, dim3(32, 8), 0, stream>>>(v, keys, pv, partial);
}
}  // namespace

void vmean_device(const float* v, int64_t n, int64_t keys, int64_t pv, Scratch& scratch, float* out,
                  cudaStream_t stream) {
  const int blocks = static_cast<int>((keys + kRowsPerBlock - 1) / kRowsPerBlock);
  // partial sums (blocks × pv doubles), then the mean row (pv floats, 16-byte aligned after them)
  auto* partial = static_cast<double*>(scratch.get((static_cast<size_t>(blocks) * pv + pv) * sizeof(double)));
  auto* mean = reinterpret_cast<float*>(partial + static_cast<size_t>(blocks) * pv);
  const int pvi = static_cast<int>(pv);
  const bool vectors = pv % 4 == 0 && pv <= 4 * kThreads && n * pv / 4 < (int64_t{1} << 31);
  chunk_sums(v, keys, pvi, blocks, vectors, partial, stream);
  column_mean_kernel<<<pvi, kThreads, 0, stream>>>(partial, blocks, keys, pvi, mean);
  if (vectors)
    broadcast4_kernel<<<blocks_for(n * pv / 4, 256), 256, 0, stream>>>(
        reinterpret_cast<const float4*>(mean), static_cast<int>(n * pv / 4), pvi / 4, reinterpret_cast<float4*>(out));
  else
    broadcast_kernel<<<blocks_for(n * pv, 256), 256, 0, stream>>>(mean, n, pvi, out);
  check_cuda(cudaGetLastError(), "vmean kernels");
}

void vmean_causal_device(const float* v, int64_t n, int64_t pv, Scratch& scratch, float* out, cudaStream_t stream) {
  const int blocks = static_cast<int>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  auto* partial = static_cast<double*>(scratch.get(static_cast<size_t>(blocks) * pv * sizeof(double)));
  const int pvi = static_cast<int>(pv);
  chunk_sums(v, n, pvi, blocks, pv % 4 == 0 && pv <= 4 * kThreads, partial, stream);
  exclusive_prefix_kernel<<<blocks_for(pv, 64), 64, 0, stream>>>(partial, blocks, pvi);
  running_mean_kernel<<<blocks, std::min(pvi, kThreads), 0, stream>>>(v, partial, n, pvi, out);
  check_cuda(cudaGetLastError(), "causal vmean kernels");
}

void vmean_cuda(const VMeanCudaParams& params) {
  const int64_t n = params.n, keys = params.keys, pv = params.pv;
  if (params.causal && keys != n) throw std::runtime_error("causal vmean needs as many keys as queries");
  DeviceBuffer<float> dv(params.v, keys * pv), dout(n * pv);
  thread_local Scratch scratch;
  if (params.causal)
    vmean_causal_device(dv.get(), n, pv, scratch, dout.get(), nullptr);
  else
    vmean_device(dv.get(), n, keys, pv, scratch, dout.get(), nullptr);
  check_launch("vmean");
  dout.download(params.out);
}

}  // namespace attnprobe::gpu
