#include "attnprobe/estimators/yoso/yoso_e/yoso_e.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/common/decode_blocks.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/estimators/yoso/yoso_backward.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

// arccos on [−1, 1] from Abramowitz & Stegun 4.4.46: acos(x) = sqrt(1−x)·P7(x) on [0, 1],
// |error| ≤ 2e-8, and acos(−x) = π − acos(x). Branch-free, so the loop vectorises (scalar acos
// runs ~0.2 G/s here, docs/performance.md).
inline float fast_acos(float x) {
  const float a = std::fabs(x);
  float poly = -0.0012624911f;
  poly = poly * a + 0.0066700901f;
  poly = poly * a - 0.0170881256f;
  poly = poly * a + 0.0308918810f;
  poly = poly * a - 0.0501743046f;
  poly = poly * a + 0.0889789874f;
  poly = poly * a - 0.2145988016f;
  poly = poly * a + 1.5707963050f;
  const float r = std::sqrt(1.0f - a) * poly;
  return x < 0 ? static_cast<float>(std::numbers::pi) - r : r;
}

template <typename T>
inline T integer_power(T base, int exponent) {  // repeated squaring: τ is an integer
  T result = 1;
  while (exponent) {
    if (exponent & 1) result *= base;
    base *= base;
    exponent >>= 1;
  }
  return result;
}

constexpr int64_t kRowBlock = 128;

class YosoExpectation final : public Estimator {
 public:
  explicit YosoExpectation(YosoExpectationParams params)
      : tau_(params.tau), lift_(params.lift), lower_bound_(params.lower_bound) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), keys = view.kf.rows();
    // Below float32 (its rounding declaration): what the expectation's PyTorch form computes with its tensors in the
    // model's dtype — every tensor it forms is stored in the precision: the unit rows, the cosines, the weights and
    // W·V; the products accumulate in float32 and the weights are computed from the stored cosines in float32.
    const Precision stored = ctx.precision;
    MatrixD q_hat, k_hat;
    yoso_inputs(view.q, view.k, lift_, q_hat, k_hat);
    MatrixF q = q_hat.cast<float>(), k = k_hat.cast<float>();
    round_in_place(q, stored);
    round_in_place(k, stored);
    out.resize(n, view.pv());
    MatrixF weights(kRowBlock, keys), led_q, led_out;
    const float inv_pi = static_cast<float>(1.0 / std::numbers::pi);
    // Blocks at absolute positions, a first one that starts inside one led by zero rows (decode_blocks.h), so
    // that rows evaluated alone get the whole slice's bits.
    for (int64_t r0 = 0; r0 < n;) {
      const auto [rows, lead] = aligned_block(view.position(r0), n - r0, kRowBlock);
      if (lead > 0) led_q = with_lead(q, r0, rows, lead);
      const int64_t computed = lead + rows;
      // Causal: the block reads keys up to its last query only, and W_ij = 0 for j > t_i.
      const int64_t cols = view.visible(r0 + rows - 1).end;
      Eigen::Map<MatrixF> w(weights.data(), computed, cols);
      gemm_abt(static_cast<int>(computed), static_cast<int>(cols), static_cast<int>(q.cols()), 1.0f,
               lead > 0 ? led_q.data() : q.data() + r0 * q.cols(), static_cast<int>(q.cols()), k.data(),
               static_cast<int>(k.cols()), 0.0f, w.data(), static_cast<int>(cols));
      float* data = w.data();
      for (int64_t e = 0; e < computed * cols; ++e) {
        const float c = std::clamp(round_to(data[e], stored), -1.0f, 1.0f);
        data[e] = round_to(integer_power(1.0f - fast_acos(c) * inv_pi, tau_), stored);
      }
      if (view.mask == Mask::kCausal)
        for (int64_t i = 0; i < rows; ++i) w.row(lead + i).tail(cols - view.visible(r0 + i).end).setZero();
      if (lead > 0) led_out.resize(computed, view.pv());
      gemm_ab(static_cast<int>(computed), static_cast<int>(view.pv()), static_cast<int>(cols), 1.0f, w.data(),
              static_cast<int>(cols), view.vf.data(), static_cast<int>(view.pv()), 0.0f,
              lead > 0 ? led_out.data() : out.data() + r0 * view.pv(), static_cast<int>(view.pv()));
      if (lead > 0) out.middleRows(r0, rows) = led_out.bottomRows(rows);
      r0 += rows;
    }
    round_in_place(out, stored);
    for (int64_t i = 0; i < n; ++i) {
      const float norm = out.row(i).norm();
      if (norm > 0) out.row(i) /= norm;
    }
  }

  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override {
    // Row blocks: the weights of 256 queries at a time (a whole n × n float64 matrix is 2 GiB at
    // n = 16384).
    MatrixD q, k;
    yoso_inputs(view.q, view.k, lift_, q, k);
    MatrixD y(view.n(), view.pv());
    for (int64_t r0 = 0; r0 < view.n(); r0 += kRowBlock * 2) {
      const int64_t rows = std::min(kRowBlock * 2, view.n() - r0);
      const int64_t cols = view.visible(r0 + rows - 1).end;
      MatrixD w = (q.middleRows(r0, rows) * k.topRows(cols).transpose()).unaryExpr([&](double c) {
        return integer_power(1.0 - std::acos(std::clamp(c, -1.0, 1.0)) / std::numbers::pi, tau_);
      });
      for (int64_t i = 0; i < rows; ++i) w.row(i).tail(cols - view.visible(r0 + i).end).setZero();
      y.middleRows(r0, rows).noalias() = w * view.v.topRows(cols);
    }
    return normalize_rows(y);
  }

  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext&) const override {
    MatrixD q, k;
    yoso_inputs(view.q, view.k, lift_, q, k);
    return yoso_expectation_gradient(q, k, view.v, upstream, tau_, lower_bound_, view.mask);
  }

  // Â_ij = W_ij/‖Y_i‖ (rows × keys, float64 as reference()), so estimate's row i is Σ_j Â_ij·v_j. Its
  // rows do not sum to one: the ℓ2 scale is part of Â (docs/metrics.md). A row with Y_i = 0 keeps W_i (its
  // estimate is 0 either way). Causal: W_ij for j ≤ i only, and ‖Y_i‖ of the causal form's Y. O(rows·keys·(p +
  // pv)) per block.
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    MatrixD q, k;
    yoso_inputs(view.q, view.k, lift_, q, k);
    return [&view, q = std::move(q), k = std::move(k), tau = tau_](int64_t r0, int64_t rows) {
      MatrixD w = (q.middleRows(r0, rows) * k.transpose()).unaryExpr([&](double c) {
        return integer_power(1.0 - std::acos(std::clamp(c, -1.0, 1.0)) / std::numbers::pi, tau);
      });
      for (int64_t i = 0; i < rows; ++i) w.row(i).tail(w.cols() - view.visible(r0 + i).end).setZero();
      const VectorD norms = (w * view.v).rowwise().norm();
      for (int64_t i = 0; i < rows; ++i)
        if (norms(i) > 0) w.row(i) /= norms(i);
      return w;
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override { return 2.0 * n * n * p + 2.0 * n * n * pv; }
  // backward(): x, the coefficients and W of a row block (kExpectationGradientRows × n each), q̂ and k̂
  // (p + 2 columns with input=lift) and the gradients, float64.
  double backward_memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    constexpr double kRows = kExpectationGradientRows;
    return 8.0 * (3.0 * kRows * n + static_cast<double>(n) * (3.0 * (p + 2) + pv));
  }

 private:
  int tau_;
  bool lift_, lower_bound_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<YosoExpectationParams>{
    .name = "yoso-e",
    .family = "yoso",
    .summary = "YOSO's expectation: W_ij = (1 - acos(cos(q_i,k_j))/pi)^tau, out = l2(W*V) (deterministic, O(n^2 p))",
    .page = "estimators/yoso.md",
    .params = ParamSet<YosoExpectationParams>()
                  .integer("tau", &YosoExpectationParams::tau, 1, 30, "hyperplane bits per hash (inverse temperature)")
                  .choice("input", &YosoExpectationParams::lift, {{"l2", false}, {"lift", true}},
                          "l2: normalise q, k rows; lift: unit rows in p+2 dims keeping the norms (q.k/M^2)")
                  .choice("grad", &YosoExpectationParams::lower_bound, {{"exact", false}, {"lower", true}},
                          "backward pass: the exact gradient, or the paper's lower bound (tau/2)(1-theta/pi)^tau"),
    .capabilities = {.random = false,
                     .forms = kFullAndCausal,
                     .decode = kFullAndCausal,
                     .weights = kFullAndCausal,
                     .rounding = "the unit rows q/‖q‖, k/‖k‖ (input=lift: q/M, k/M with their lifts), the cosines "
                                 "(accumulated float32), the weights (1 − acos(c)/π)^τ (computed float32 from the "
                                 "stored cosines) and W·V (accumulated float32) stored in the precision, as the "
                                 "expectation's PyTorch form computes in the model's dtype; each row's ℓ2 norm float32 "
                                 "from the stored W·V; output rounded",
                     .backward = Backward::kYoso,
                     .backward_forms = kFullAndCausal},
    // input=lift divides by the largest norm of the whole sequence: a later token changes row i, and any
    // other query row changes every row (no decode form).
    .narrow =
        [](const YosoExpectationParams& params, Capabilities& can) {
          if (params.lift) {
            can.forms = kFullOnly;
            can.decode = {};
          }
        },
    .target = [](const YosoExpectationParams&) { return std::string("softmax"); },
    .devices = {{.device = Device::kCuda, .forms = kFullAndCausal, .tolerance = 1e-6}},
    .make = [](const YosoExpectationParams& params) { return std::make_unique<YosoExpectation>(params); },
});

}  // namespace
}  // namespace attnprobe
