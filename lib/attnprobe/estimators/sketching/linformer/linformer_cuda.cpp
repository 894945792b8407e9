// The CUDA version of `linformer` (linformer.cpp): the Gaussian projection is drawn on the host by the CPU's
// own gaussian_matrix() and uploaded, so both devices use the same E.
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/gaussian_projection.h"
#include "attnprobe/estimators/sketching/linformer/linformer.h"
#include "attnprobe/estimators/sketching/linformer/linformer_cuda_params.h"

namespace attnprobe::gpu {
namespace {

class CudaLinformer final : public Estimator {
 public:
  explicit CudaLinformer(LinformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t keys = view.kf.rows();
    const MatrixF e =
        gaussian_matrix(params_.d, keys, params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection));
    out.resize(view.n(), view.pv());
    linformer_cuda({.q = view.qf.data(),
                    .k = view.kf.data(),
                    .v = view.vf.data(),
                    .e = e.data(),
                    .n = view.n(),
                    .keys = keys,
                    .p = view.p(),
                    .pv = view.pv(),
                    .d = params_.d,
                    .scale = static_cast<float>(view.scale),
                    .out = out.data()});
  }

 private:
  LinformerParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation<LinformerParams>(
    "linformer", Device::kCuda, [](const LinformerParams& params) { return std::make_unique<CudaLinformer>(params); });

}  // namespace
}  // namespace attnprobe::gpu
