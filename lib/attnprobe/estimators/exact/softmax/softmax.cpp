#include "attnprobe/estimators/exact/softmax/softmax.h"

#include <algorithm>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_at_precision.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

class SoftmaxEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    out = exact_attention_at(view, ctx.precision, ctx.pool);  // float32, or FlashAttention-2's points below it
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool* pool) const override {
    return exact_attention_f64(view.q, view.k, view.v, view.scale, pool, view.geometry(), &view.shaping);
  }
  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext&) const override {
    // The planner refuses gradient metrics on such layers; this guards the other callers.
    require_usage(!view.shaping.any(),
                  "the gradient of exact attention under score shaping ({}) is not implemented; drop the gradient "
                  "metrics for this layer",
                  view.shaping.description());
    const int64_t n = view.n();
    Gradients out;
    out.q.resize(n, view.p());
    out.v = MatrixD::Zero(view.k.rows(), view.pv());
    out.pair_fraction = 1.0;
    for (int64_t r0 = 0; r0 < n; r0 += kBackwardRows) {
      const int64_t rows = std::min(kBackwardRows, n - r0);
      const MatrixD a = attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.geometry());  // rows × keys
      const auto g = upstream.middleRows(r0, rows);
      MatrixD ds = g * view.v.transpose();  // dA, then dS
      const VectorD centre = (a.array() * ds.array()).rowwise().sum();
      ds = (a.array() * (ds.colwise() - centre).array()).matrix();
      out.q.middleRows(r0, rows).noalias() = view.scale * ds * view.k;
      out.v.noalias() += a.transpose() * g;
    }
    return out;
  }

  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    return [&view](int64_t r0, int64_t rows) {
      return attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.geometry(), &view.shaping);
    };
  }
  // backward(): A and dS of a row block (kBackwardRows × n each) and the gradients, float64.
  double backward_memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    return 8.0 * (2.0 * static_cast<double>(kBackwardRows) * n + static_cast<double>(n) * (p + pv));
  }
  // Q·Kᵀ and P·V: 2·n²·p + 2·n²·pv (the exponentials are not counted).
  double flops(int64_t n, int64_t p, int64_t pv) const override { return 2.0 * n * n * p + 2.0 * n * n * pv; }

 private:
  static constexpr int64_t kBackwardRows = 256;  ///< query rows per block of backward()
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<SoftmaxParams>{
    .name = "softmax",
    .family = "exact",
    .summary = "exact attention softmax(s*Q*K^T)*V (float32 blocked; float64 as a reference)",
    .page = "estimators/exact.md",
    .capabilities = {.random = false,
                     .forms = kAllMasks,
                     .decode = kAllMasks,
                     .weights = kAllMasks,
                     .shaping = true,
                     .rounding = "FlashAttention-2's forward: S = s·QKᵀ and the row sums float32, P = exp(S − rowmax) "
                                 "rounded for P·V, P·V float32, the output rounded (each float32 sum made in "
                                 "float64 and stored once)",
                     .backward = Backward::kOut,
                     .backward_forms = kAllMasks},
    .target = [](const SoftmaxParams&) { return std::string("softmax"); },
    // Self-attention: the tensor-core kernel with each product split into three TF32 ones (tf32x3); rows at
    // positions against a cache and windows: the decode kernel, float32. Both at fp32-level error.
    .devices = {{.device = Device::kCuda, .forms = kAllMasks, .decode = kAllMasks, .tolerance = 1e-6}},
    .make = [](const SoftmaxParams&) { return std::make_unique<SoftmaxEstimator>(); },
});

}  // namespace
}  // namespace attnprobe
