// Exact attention on the GPU (mirrors exact/exact_attention.cpp): flash-style, one thread per query
// row, keys and values staged through shared memory in tiles, online softmax (running max m, sum l,
// output rescaled by exp(m_old − m_new)), so the n × keys matrix is never formed. Acc = float is the
// fast path; Acc = double is the fp64-accumulation reference mode.
#include <cmath>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/kernels.h"

namespace attnprobe::gpu {

namespace {
constexpr int kMaxDim = 128;   // per-thread query and accumulator arrays
constexpr int kKeyTile = 32;   // keys per shared-memory tile: 32 × (128 + 128) floats = 32 KiB
constexpr int kThreads = 128;  // query rows per block

template <typename Acc>
__global__ void flash_attention_kernel(const float* q, const float* k, const float* v, int n, int keys, int p, int pv,
                                       float scale, float* out) {
  extern __shared__ float tile[];
  float* k_tile = tile;
  float* v_tile = tile + kKeyTile * p;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = i < n;
  Acc query[kMaxDim], acc[kMaxDim];
  Acc running_max = -INFINITY, running_sum = 0;
  for (int c = 0; c < pv; ++c) acc[c] = 0;
  if (active)
    for (int c = 0; c < p; ++c)
      query[c] = static_cast<Acc>(q[static_cast<int64_t>(i) * p + c]) * static_cast<Acc>(scale);
  for (int t0 = 0; t0 < keys; t0 += kKeyTile) {
    const int rows = min(kKeyTile, keys - t0);
    for (int idx = threadIdx.x; idx < rows * p; idx += blockDim.x) k_tile[idx] = k[static_cast<int64_t>(t0) * p + idx];
    for (int idx = threadIdx.x; idx < rows * pv; idx += blockDim.x)
      v_tile[idx] = v[static_cast<int64_t>(t0) * pv + idx];
    __syncthreads();
    if (active) {
      for (int j = 0; j < rows; ++j) {
        Acc logit = 0;
        for (int c = 0; c < p; ++c) logit += query[c] * static_cast<Acc>(k_tile[j * p + c]);
        if (logit > running_max) {
          const Acc correction = exp(running_max - logit);  // 0 on the first key
          running_sum *= correction;
          for (int c = 0; c < pv; ++c) acc[c] *= correction;
          running_max = logit;
        }
        const Acc weight = exp(logit - running_max);
        running_sum += weight;
        for (int c = 0; c < pv; ++c) acc[c] += weight * static_cast<Acc>(v_tile[j * pv + c]);
      }
    }
    __syncthreads();
  }
  if (active)
    for (int c = 0; c < pv; ++c) out[static_cast<int64_t>(i) * pv + c] = static_cast<float>(acc[c] / running_sum);
}
}  // namespace

void exact_attention(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                     float scale, bool fp64, float* out) {
  if (p > kMaxDim || pv > kMaxDim)
    throw InputError("CUDA exact attention supports head dims up to 128 (got " + std::to_string(p) + ", " +
                     std::to_string(pv) + ")");
  DeviceBuffer<float> dq(q, n * p), dk(k, keys * p), dv(v, keys * pv), dout(n * pv);
  const size_t shared = static_cast<size_t>(kKeyTile) * (p + pv) * sizeof(float);
  if (fp64)
    flash_attention_kernel<double><<<blocks_for(n, kThreads), kThreads, shared>>>(
        dq.get(), dk.get(), dv.get(), static_cast<int>(n), static_cast<int>(keys), static_cast<int>(p),
        static_cast<int>(pv), scale, dout.get());
  else
    flash_attention_kernel<float><<<blocks_for(n, kThreads), kThreads, shared>>>(
        dq.get(), dk.get(), dv.get(), static_cast<int>(n), static_cast<int>(keys), static_cast<int>(p),
        static_cast<int>(pv), scale, dout.get());
  check_launch("flash_attention_kernel");
  dout.download(out);
}

}  // namespace attnprobe::gpu

// The CUDA version of `softmax` (estimators/exact/softmax.cpp): the flash-style kernel above.
namespace attnprobe::gpu {
namespace {

class CudaSoftmax final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out.resize(view.n(), view.pv());
    exact_attention(view.qf.data(), view.kf.data(), view.vf.data(), view.n(), view.kf.rows(), view.p(), view.pv(),
                    static_cast<float>(view.scale), false, out.data());
  }
  double flops(int64_t n, int64_t p, int64_t pv) const override { return 2.0 * n * n * (p + pv); }
};

[[maybe_unused]] const bool kOnCuda =
    register_implementation("softmax", Device::kCuda, [](const Spec&) { return std::make_unique<CudaSoftmax>(); });

}  // namespace
}  // namespace attnprobe::gpu
