// The device's read bandwidth as a kernel sees it: every float of an array read once (16-byte loads,
// grid-stride), summed per block so the loads cannot be dropped. The ceiling of a kernel bound by
// reading its inputs once, such as decode attention (apps/gpu_bench; a copy's rate counts writes too).
#include <algorithm>

#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"

namespace attnprobe::gpu {
namespace {

__global__ void __launch_bounds__(256)
    read_kernel(const float4* __restrict__ data, int64_t count4, float* __restrict__ block_sums) {
  float sum = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 x = __ldg(data + i);
    sum += (x.x + x.y) + (x.z + x.w);
  }
  for (int b = 16; b >= 1; b /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, b);
  __shared__ float warp_sums[8];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < 8; ++w) total += warp_sums[w];
    block_sums[blockIdx.x] = total;
  }
}

}  // namespace

void read_all_device(const float* data, int64_t count, Scratch& scratch, cudaStream_t stream) {
  if (count % 4 != 0 || reinterpret_cast<uintptr_t>(data) % 16 != 0)
    throw std::runtime_error("read_all_device: a 16-byte aligned array of whole float4s");
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
  const int blocks = static_cast<int>(std::min<int64_t>(sms * 8, std::max<int64_t>(1, count / 4 / 256)));
  float* block_sums = static_cast<float*>(scratch.get(blocks * sizeof(float)));
  read_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(data), count / 4, block_sums);
  check_cuda(cudaGetLastError(), "read_kernel");
}

}  // namespace attnprobe::gpu
