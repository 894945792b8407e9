// softmax — exact attention, the target of most estimators (docs/estimators/exact.md).
// As an estimator it runs the blocked float32 path, so its row in a sweep shows the float32
// rounding floor (~1e-7 relative) against the float64 reference; as a reference it is float64.
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

class SoftmaxEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    exact_attention_f32(view.qf, view.kf, view.vf, static_cast<float>(view.scale), out, ctx.pool);
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool* pool) const override {
    return exact_attention_f64(view.q, view.k, view.v, view.scale, pool);
  }
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    return [&view](int64_t r0, int64_t rows) { return attention_rows_f64(view.q, view.k, view.scale, r0, rows); };
  }
  // Q·Kᵀ and P·V: 2·n²·p + 2·n²·pv (the exponentials are not counted).
  double flops(int64_t n, int64_t p, int64_t pv) const override { return 2.0 * n * n * p + 2.0 * n * n * pv; }
};

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "softmax",
    .family = "exact",
    .summary = "exact attention softmax(s*Q*K^T)*V (float32 blocked; float64 as a reference)",
    .params = {},
    .samples_knob = "",
    .random = false,
    .target = [](const Spec&) { return std::string("softmax"); },
    .weights = true,
    .make = [](const Spec&) { return std::make_unique<SoftmaxEstimator>(); },
});

}  // namespace
}  // namespace attnprobe
