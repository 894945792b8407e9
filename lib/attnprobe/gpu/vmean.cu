// V-Mean on the GPU (mirrors estimators/sketching/vmean.cpp): column means in double, broadcast.
#include "attnprobe/estimators/registry.h"
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

// The CUDA version of `vmean` (estimators/sketching/vmean.cpp).
namespace attnprobe::gpu {
namespace {

class CudaVMean final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out.resize(view.n(), view.pv());
    vmean(view.vf.data(), view.n(), view.vf.rows(), view.pv(), out.data());
  }
};

[[maybe_unused]] const bool kOnCuda =
    register_implementation("vmean", Device::kCuda, [](const Spec&) { return std::make_unique<CudaVMean>(); });

}  // namespace
}  // namespace attnprobe::gpu
