#include "attnprobe/estimators/sketching/linformer_jlt/linformer_jlt.h"

#include "attnprobe/common/error.h"
#include "attnprobe/common/rounding.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/gaussian_projection.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

class LinformerJlt final : public Estimator {
 public:
  explicit LinformerJlt(LinformerJltParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    // S is keys × d: row j of S is row j of the stream, scaled by 1/√d. Below float32 (its rounding declaration) S is
    // stored as drawn, Sᵀ·V and S·(Sᵀ·V) are accumulated in float32 and stored, and the attention runs at
    // FlashAttention-2's points; round_in_place leaves float32 as it is.
    MatrixF s = gaussian_matrix(view.keys(), params_.d, params_.stddev(), RandomStream(ctx.key, Purpose::kProjection));
    round_in_place(s, ctx.precision);
    MatrixF projected_v = s.transpose() * view.vf;  // Sᵀ·V, d × pv
    round_in_place(projected_v, ctx.precision);
    MatrixF sketched_v = s * projected_v;  // S·Sᵀ·V, keys × pv
    round_in_place(sketched_v, ctx.precision);
    exact_attention_in(view.qf, view.kf, sketched_v, static_cast<float>(view.scale), ctx.precision, out, ctx.pool,
                       view.geometry());
  }

  // out = A·S·Sᵀ·V, so Â = A·S·Sᵀ (rows × n) with A the exact softmax: unbiased for A entry by entry, rows
  // summing to A_i·S·Sᵀ·1 ≠ 1, entries of either sign. Float64 from the same S. O(rows·n·(p + d)) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "linformer-jlt has no causal form");
    MatrixD s = gaussian_matrix(view.keys(), params_.d, params_.stddev(), RandomStream(ctx.key, Purpose::kProjection))
                    .cast<double>();  // keys × d
    return [&view, s = std::move(s)](int64_t r0, int64_t rows) {
      return MatrixD((attention_rows_f64(view.q, view.k, view.scale, r0, rows, view.geometry()) * s) * s.transpose());
    };
  }

  // S (n × d), Sᵀ·V (d × pv) and S·Sᵀ·V (n × pv), float32.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double d = static_cast<double>(params_.d);
    return 4.0 * (d * n + d * pv + static_cast<double>(n) * pv) + 16.0 * n * (p + pv);
  }

  // Sᵀ·V and S·(Sᵀ·V) (2·n·d·pv each), then exact attention.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * n * static_cast<double>(params_.d) * pv + 2.0 * n * static_cast<double>(n) * (p + pv);
  }

 private:
  LinformerJltParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<LinformerJltParams>{
    .name = "linformer-jlt",
    .family = "sketching",
    .summary = "unreduced JL sketch B*S*S^T*V, unbiased for B*V (O(n^2); what Linformer gave up)",
    .page = "estimators/sketching.md",
    .params = ParamSet<LinformerJltParams>().integer("d", &LinformerJltParams::d, 1, 1 << 20,
                                                     "sketch width (S is n x d, entries N(0, 1/d))"),
    .samples_knob = "d",
    .capabilities = {.random = true,
                     .decode = kFullOnly,
                     .weights = kFullOnly,
                     .rounding =
                         "S stored in the precision as drawn; Sᵀ·V and S·Sᵀ·V accumulated float32 and stored in "
                         "it; the attention over the keys with values S·Sᵀ·V at FlashAttention-2's points "
                         "(softmax's)"},
    .devices = {{.device = Device::kCuda, .forms = kFullOnly, .tolerance = 1e-4}},
    .make = [](const LinformerJltParams& params) { return std::make_unique<LinformerJlt>(params); },
});

}  // namespace
}  // namespace attnprobe
