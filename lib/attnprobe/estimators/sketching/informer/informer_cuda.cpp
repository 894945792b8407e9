// The CUDA version of `informer` (informer.cpp). The query selection (U sampled logits per query, O(n·U·p))
// runs on the host through the CPU's own informer_active_rows(), so both devices pick exactly the same rows
// (a single differing row would move the output by ~1e-2); the device computes the u exact rows and mean(V)
// for the others (informer.cu). Biased, as the CPU version.
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/informer/informer.h"
#include "attnprobe/estimators/sketching/informer/informer_cuda_params.h"

namespace attnprobe::gpu {
namespace {

class CudaInformer final : public Estimator {
 public:
  explicit CudaInformer(InformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const std::vector<int64_t> active = informer_active_rows(view, ctx.key, params_);
    const std::vector<int32_t> active32(active.begin(), active.end());
    out.resize(view.n(), view.pv());
    informer_cuda({.q = view.qf.data(),
                   .k = view.kf.data(),
                   .v = view.vf.data(),
                   .active = active32.data(),
                   .u = static_cast<int64_t>(active32.size()),
                   .n = view.n(),
                   .keys = view.kf.rows(),
                   .p = view.p(),
                   .pv = view.pv(),
                   .scale = static_cast<float>(view.scale),
                   .out = out.data()});
  }

 private:
  InformerParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation<InformerParams>(
    "informer", Device::kCuda, [](const InformerParams& params) { return std::make_unique<CudaInformer>(params); });

}  // namespace
}  // namespace attnprobe::gpu
