// vmean — the rank-one baseline of the Skeinformer paper (docs/estimators/sketching.md):
// out_i = (1/n)·Σ_j v_j for every query i, i.e. uniform attention. Deterministic; exact when
// attention is uniform, and the error every sampling method must beat on peaked attention.
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

class VMeanEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    // Accumulate the mean in double: a float sum over thousands of rows loses ~1e-5 relative.
    const RowVectorF mean = view.vf.cast<double>().colwise().mean().cast<float>();
    out = mean.replicate(view.n(), 1);
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override {
    return MatrixD(view.v.colwise().mean().replicate(view.n(), 1));
  }
  // Uniform attention: Â_ij = 1/keys.
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    return [keys = view.v.rows()](int64_t, int64_t rows) { return MatrixD::Constant(rows, keys, 1.0 / keys); };
  }
};

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "vmean",
    .family = "sketching",
    .summary = "rank-one baseline: every output row is the mean of V (uniform attention)",
    .params = {},
    .samples_knob = "",
    .random = false,
    .target = nullptr,
    .weights = true,
    .make = [](const Spec&) { return std::make_unique<VMeanEstimator>(); },
});

}  // namespace
}  // namespace attnprobe
