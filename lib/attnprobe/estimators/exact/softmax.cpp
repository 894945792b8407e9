// softmax — exact attention, the target of most estimators (docs/estimators/exact.md).
// As an estimator it runs the blocked float32 path, so its row in a sweep shows the float32
// rounding floor (~1e-7 relative) against the float64 reference; as a reference it is float64.
// Causal form (mask = causal): keys j ≤ i only; the float32 path skips the masked key blocks.
// Backward (float64, blocks of 256 query rows, never n × n): with A = softmax(s·QKᵀ) and L = ⟨G, A·V⟩,
//   dA = G·Vᵀ,  dS = A ⊙ (dA − rowsum(A ⊙ dA)),  ∇_Q = s·dS·K,  ∇_V = Aᵀ·G;
// causal: A the masked softmax, whose zeros above the diagonal keep dS and Aᵀ·G there at 0.
#include <algorithm>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

class SoftmaxEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    exact_attention_f32(view.qf, view.kf, view.vf, static_cast<float>(view.scale), out, ctx.pool, view.mask);
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool* pool) const override {
    return exact_attention_f64(view.q, view.k, view.v, view.scale, pool, view.mask);
  }
  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext&) const override {
    const int64_t n = view.n();
    Gradients out;
    out.q.resize(n, view.p());
    out.v = MatrixD::Zero(view.k.rows(), view.pv());
    out.pair_fraction = 1.0;
    for (int64_t r0 = 0; r0 < n; r0 += kBackwardRows) {
      const int64_t rows = std::min(kBackwardRows, n - r0);
      const MatrixD a = attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.mask);  // rows × keys
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
      return attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.mask);
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

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "softmax",
    .family = "exact",
    .summary = "exact attention softmax(s*Q*K^T)*V (float32 blocked; float64 as a reference)",
    .params = {},
    .samples_knob = "",
    .random = false,
    .target = [](const Spec&) { return std::string("softmax"); },
    .causal = true,
    .weights = true,
    .causal_weights = true,
    .backward = "out",
    .causal_backward = true,
    .make = [](const Spec&) { return std::make_unique<SoftmaxEstimator>(); },
});

}  // namespace
}  // namespace attnprobe
