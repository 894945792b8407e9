#include <cmath>

#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/random_features/performer/performer.h"
#include "attnprobe/estimators/random_features/performer/performer_cuda_params.h"
#include "attnprobe/estimators/registry.h"

// The CUDA version of `performer` (performer.cpp), with its causal form:
// the features are drawn on the host by the CPU's own function, so both devices use the same ω.
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
    performer_cuda({.q_scaled = q.data(),
                    .k_scaled = k.data(),
                    .v = view.v.data(),
                    .omegas = omegas.data(),
                    .n = view.n(),
                    .keys = k.rows(),
                    .p = view.p(),
                    .pv = view.pv(),
                    .features = params_.features,
                    .causal = view.mask == Mask::kCausal,
                    .out = out.data()});
  }

 private:
  PerformerParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation<PerformerParams>(
    "performer", Device::kCuda, [](const PerformerParams& params) { return std::make_unique<CudaPerformer>(params); });

}  // namespace
}  // namespace attnprobe::gpu
