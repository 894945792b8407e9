// The CUDA version of `linformer-jlt` (linformer_jlt.cpp): S is drawn on the host by the CPU's own
// gaussian_matrix() and uploaded, so both devices use the same sketch.
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/gaussian_projection.h"
#include "attnprobe/estimators/sketching/linformer_jlt/linformer_jlt.h"
#include "attnprobe/estimators/sketching/linformer_jlt/linformer_jlt_cuda_params.h"

namespace attnprobe::gpu {
namespace {

class CudaLinformerJlt final : public Estimator {
 public:
  explicit CudaLinformerJlt(LinformerJltParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t keys = view.kf.rows();
    const MatrixF s = gaussian_matrix(keys, params_.d, params_.stddev(), RandomStream(ctx.key, Purpose::kProjection));
    out.resize(view.n(), view.pv());
    linformer_jlt_cuda({.q = view.qf.data(),
                        .k = view.kf.data(),
                        .v = view.vf.data(),
                        .s = s.data(),
                        .n = view.n(),
                        .keys = keys,
                        .p = view.p(),
                        .pv = view.pv(),
                        .d = params_.d,
                        .scale = static_cast<float>(view.scale),
                        .out = out.data()});
  }

 private:
  LinformerJltParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation<LinformerJltParams>(
    "linformer-jlt", Device::kCuda,
    [](const LinformerJltParams& params) { return std::make_unique<CudaLinformerJlt>(params); });

}  // namespace
}  // namespace attnprobe::gpu
