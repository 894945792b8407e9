// The CUDA version of `skeinformer` (skeinformer.cpp). Steps 1-3 (pilot rows, their exact rows B_J·V, the
// column probabilities and the sampled columns J′; O(d·n·p)) run on the host through the CPU's own
// skeinformer_sample(), so both devices use exactly the same rows and columns; the device does steps 4-5
// (skeinformer.cu); step 6 (the pilot rows' exact values) is written here after the download. Biased, as the
// CPU version.
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/skeinformer/skeinformer.h"
#include "attnprobe/estimators/sketching/skeinformer/skeinformer_cuda_params.h"

namespace attnprobe::gpu {
namespace {

class CudaSkeinformer final : public Estimator {
 public:
  explicit CudaSkeinformer(SkeinformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const SkeinformerSample sample = skeinformer_sample(view, ctx.key, params_);
    const MatrixF k_sel = view.kf(sample.columns, Eigen::all), v_sel = view.vf(sample.columns, Eigen::all);
    // As the CPU: Σ_j v_j − Σ_{c∈J′} v_c from float64 column sums, each rounded to float first.
    const RowVectorF v_total = view.vf.cast<double>().colwise().sum().cast<float>();
    const RowVectorF v_missing = v_total - v_sel.cast<double>().colwise().sum().cast<float>();
    out.resize(view.n(), view.pv());
    skeinformer_cuda({.q = view.qf.data(),
                      .k = view.kf.data(),
                      .k_sel = k_sel.data(),
                      .v_sel = v_sel.data(),
                      .v_missing = v_missing.data(),
                      .n = view.n(),
                      .keys = view.kf.rows(),
                      .s = static_cast<int64_t>(sample.columns.size()),
                      .p = view.p(),
                      .pv = view.pv(),
                      .scale = static_cast<float>(view.scale),
                      .mode = params_.rownorm == RowNorm::kAdaptive ? SketchRowNorm::kAdaptive
                              : params_.rownorm == RowNorm::kSimple ? SketchRowNorm::kSimple
                                                                    : SketchRowNorm::kExact,
                      .out = out.data()});
    // Step 6: pilot reuse (the pilot rows' exact values, computed in skeinformer_sample()).
    if (params_.reuses_pilot())
      for (size_t r = 0; r < sample.pilot.size(); ++r) out.row(sample.pilot[r]) = sample.pilot_out.row(r);
  }

 private:
  SkeinformerParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation<SkeinformerParams>(
    "skeinformer", Device::kCuda,
    [](const SkeinformerParams& params) { return std::make_unique<CudaSkeinformer>(params); });

}  // namespace
}  // namespace attnprobe::gpu
