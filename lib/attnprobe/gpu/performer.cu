// Performer on the GPU (mirrors estimators/random_features/performer.cpp), float64 throughout: query
// features exp(ω·q̃ − row max), key features exp(ω·k̃ − ‖k̃‖²/2 − slice max), then the ratio
// φ(q)·(φ(K)ᵀV) / φ(q)·Σ_j φ(k_j). The features ω are drawn on the host by the same function as
// the CPU estimator and uploaded, so both use identical random features.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/random_features/performer_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/kernels.h"

namespace attnprobe::gpu {

namespace {
// out(i, m) = x_i·ω_m − (subtract_norm ? ‖x_i‖²/2 : 0)
__global__ void feature_logits_kernel(const double* x, const double* omegas, int n, int p, int features,
                                      bool subtract_norm, double* out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(n) * features) return;
  const int m = static_cast<int>(idx % features);
  const int64_t i = idx / features;
  double dot = 0, norm2 = 0;
  for (int c = 0; c < p; ++c) {
    const double xc = x[i * p + c];
    dot += xc * omegas[static_cast<int64_t>(m) * p + c];
    norm2 += xc * xc;
  }
  out[idx] = subtract_norm ? dot - 0.5 * norm2 : dot;
}

__global__ void row_max_kernel(const double* x, int rows, int cols, double* max) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double best = -INFINITY;
  for (int c = 0; c < cols; ++c) best = fmax(best, x[static_cast<int64_t>(r) * cols + c]);
  max[r] = best;
}

// x(r, c) = exp(x(r, c) − shift(r)) (shift per row) or exp(x − shift(0)) (one shift)
__global__ void shifted_exp_kernel(double* x, int rows, int cols, const double* shift, bool per_row) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(rows) * cols) return;
  x[idx] = exp(x[idx] - shift[per_row ? idx / cols : 0]);
}

// kv(m, c) = Σ_j kf(j, m)·v(j, c) for c < pv, and column pv holds Σ_j kf(j, m)
__global__ void key_summary_kernel(const double* kf, const double* v, int keys, int features, int pv, double* kv) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(features) * (pv + 1)) return;
  const int c = static_cast<int>(idx % (pv + 1));
  const int64_t m = idx / (pv + 1);
  double sum = 0;
  for (int j = 0; j < keys; ++j)
    sum += kf[static_cast<int64_t>(j) * features + m] * (c < pv ? v[static_cast<int64_t>(j) * pv + c] : 1.0);
  kv[idx] = sum;
}

__global__ void ratio_kernel(const double* qf, const double* kv, int n, int features, int pv, float* out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(n) * pv) return;
  const int c = static_cast<int>(idx % pv);
  const int64_t i = idx / pv;
  double numerator = 0, denominator = 0;
  for (int m = 0; m < features; ++m) {
    const double f = qf[i * features + m];
    numerator += f * kv[static_cast<int64_t>(m) * (pv + 1) + c];
    denominator += f * kv[static_cast<int64_t>(m) * (pv + 1) + pv];
  }
  out[idx] = static_cast<float>(numerator / denominator);
}
}  // namespace

void performer(const double* q_scaled, const double* k_scaled, const double* v, const double* omegas, int64_t n,
               int64_t keys, int64_t p, int64_t pv, int64_t features, float* out) {
  const int ni = static_cast<int>(n), ki = static_cast<int>(keys), pi = static_cast<int>(p), pvi = static_cast<int>(pv),
            mi = static_cast<int>(features);
  DeviceBuffer<double> dq(q_scaled, n * p), dk(k_scaled, keys * p), dv(v, keys * pv), dw(omegas, features * p);
  DeviceBuffer<double> qf(n * features), kf(keys * features), row_max(std::max(n, keys)), kv(features * (pv + 1));
  DeviceBuffer<float> dout(n * pv);
  feature_logits_kernel<<<blocks_for(n * features, 256), 256>>>(dq.get(), dw.get(), ni, pi, mi, false, qf.get());
  check_launch("feature_logits_kernel(q)");
  row_max_kernel<<<blocks_for(n, 128), 128>>>(qf.get(), ni, mi, row_max.get());
  check_launch("row_max_kernel(q)");
  shifted_exp_kernel<<<blocks_for(n * features, 256), 256>>>(qf.get(), ni, mi, row_max.get(), true);
  check_launch("shifted_exp_kernel(q)");
  feature_logits_kernel<<<blocks_for(keys * features, 256), 256>>>(dk.get(), dw.get(), ki, pi, mi, true, kf.get());
  check_launch("feature_logits_kernel(k)");
  row_max_kernel<<<blocks_for(keys, 128), 128>>>(kf.get(), ki, mi, row_max.get());
  check_launch("row_max_kernel(k)");
  std::vector<double> maxima(keys);  // one shift for the whole slice: the max over all keys
  check_cuda(cudaMemcpy(maxima.data(), row_max.get(), keys * sizeof(double), cudaMemcpyDeviceToHost), "download");
  const double slice_max = *std::max_element(maxima.begin(), maxima.end());
  DeviceBuffer<double> shift(&slice_max, 1);
  shifted_exp_kernel<<<blocks_for(keys * features, 256), 256>>>(kf.get(), ki, mi, shift.get(), false);
  check_launch("shifted_exp_kernel(k)");
  key_summary_kernel<<<blocks_for(features * (pv + 1), 128), 128>>>(kf.get(), dv.get(), ki, mi, pvi, kv.get());
  check_launch("key_summary_kernel");
  ratio_kernel<<<blocks_for(n * pv, 256), 256>>>(qf.get(), kv.get(), ni, mi, pvi, dout.get());
  check_launch("ratio_kernel");
  dout.download(out);
}

}  // namespace attnprobe::gpu

// The CUDA version of `performer` (estimators/random_features/performer.cpp): the features are drawn
// on the host by the CPU's own function, so both devices use the same ω.
namespace attnprobe::gpu {
namespace {

class CudaPerformer final : public Estimator {
 public:
  explicit CudaPerformer(PerformerParams params) : params_(params) {}
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(params_.features, view.p(), params_.orthogonal, ctx.key);
    const MatrixD q = root_scale * view.q, k = root_scale * view.k;
    out.resize(view.n(), view.pv());
    performer(q.data(), k.data(), view.v.data(), omegas.data(), view.n(), k.rows(), view.p(), view.pv(),
              params_.features, out.data());
  }

 private:
  PerformerParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation("performer", Device::kCuda, [](const Spec& spec) {
  return std::make_unique<CudaPerformer>(PerformerParams::from_spec(spec));
});

}  // namespace
}  // namespace attnprobe::gpu
