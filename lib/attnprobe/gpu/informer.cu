// Informer (ProbSparse) on the GPU (mirrors estimators/sketching/informer.cpp). The query selection
// (U sampled logits per query, O(n·U·p)) runs on the host through the CPU's own
// informer_active_rows(), so both devices pick exactly the same rows (a single differing row would
// move the output by ~1e-2); the device computes the u exact rows (3×TF32 tensor cores, O(u·n·p))
// and mean(V) for the others (float64 sums). Biased, as the CPU version.
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/informer_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/sketch_kernels.cuh"

namespace attnprobe::gpu {
namespace {

// out (n × pv): row active[r] = rows(r) for r < u (rows: u × pv), every other row already mean(V).
__global__ void scatter_rows_kernel(const float* rows, const int32_t* active, int64_t u, int pv, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= u * pv) return;
  out[static_cast<int64_t>(active[idx / pv]) * pv + idx % pv] = rows[idx];
}

class CudaInformer final : public Estimator {
 public:
  explicit CudaInformer(InformerParams params) : params_(params) {}

  // out: n × pv. Uploads Q, K, V and the u active row indices.
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), keys = view.kf.rows(), p = view.p(), pv = view.pv();
    const std::vector<int64_t> active = informer_active_rows(view, ctx.key, params_);
    const int64_t u = static_cast<int64_t>(active.size());
    const std::vector<int32_t> active32(active.begin(), active.end());
    DeviceBuffer<float> dq(view.qf.data(), n * p), dk(view.kf.data(), keys * p), dv(view.vf.data(), keys * pv),
        dq_active(u * p), drows(u * pv), dout(n * pv);
    DeviceBuffer<int32_t> dactive(active32.data(), u);
    thread_local Scratch scratch, mean_scratch;
    gather_rows(dq.get(), dactive.get(), u, p, dq_active.get());
    exact_attention_device(dq_active.get(), dk.get(), dv.get(), u, keys, p, pv, static_cast<float>(view.scale), false,
                           AttentionPrecision::kTf32x3, scratch, drows.get());
    vmean_device(dv.get(), n, keys, pv, mean_scratch, dout.get());
    scatter_rows_kernel<<<blocks_for(u * pv, 256), 256>>>(drows.get(), dactive.get(), u, static_cast<int>(pv),
                                                          dout.get());
    check_launch("informer");
    out.resize(n, pv);
    dout.download(out.data());
  }

 private:
  InformerParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation("informer", Device::kCuda, [](const Spec& spec) {
  return std::make_unique<CudaInformer>(InformerParams::from_spec(spec));
});

}  // namespace
}  // namespace attnprobe::gpu
