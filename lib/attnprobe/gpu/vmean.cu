// V-Mean on the GPU (mirrors estimators/sketching/vmean.cpp): column means in double, broadcast.
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/kernels.h"

namespace attnprobe::gpu {

namespace {
__global__ void column_mean_kernel(const float* v, int keys, int pv, double* mean) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= pv) return;
  double sum = 0;
  for (int j = 0; j < keys; ++j) sum += v[static_cast<int64_t>(j) * pv + c];
  mean[c] = sum / keys;
}

__global__ void broadcast_kernel(const double* mean, int64_t n, int pv, float* out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx < n * pv) out[idx] = static_cast<float>(mean[idx % pv]);
}
}  // namespace

void vmean(const float* v, int64_t n, int64_t keys, int64_t pv, float* out) {
  DeviceBuffer<float> dv(v, keys * pv), dout(n * pv);
  DeviceBuffer<double> mean(pv);
  column_mean_kernel<<<blocks_for(pv, 64), 64>>>(dv.get(), static_cast<int>(keys), static_cast<int>(pv), mean.get());
  check_launch("column_mean_kernel");
  broadcast_kernel<<<blocks_for(n * pv, 256), 256>>>(mean.get(), n, static_cast<int>(pv), dout.get());
  check_launch("broadcast_kernel");
  dout.download(out);
}

}  // namespace attnprobe::gpu
