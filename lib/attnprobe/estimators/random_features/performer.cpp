// performer(M, ortho) — RFA / Performer positive random features (Choromanski et al., ICLR 2021;
// Peng et al., ICLR 2021; docs/estimators/random-features.md). Target: softmax.
//   φ(x) = M^{-1/2}·[ξ(x, ω_1) … ξ(x, ω_M)],  out_i = φ(q_i)·(Σ_j φ(k_j)ᵀ v_j) / (φ(q_i)·Σ_j φ(k_j)).
// φ(q)·φ(k) is unbiased for exp(s·q·k) (tested); the ratio is consistent, not unbiased. Log space:
// a per-row shift for queries and one shift per slice for keys cancel exactly; no epsilon is added
// (the reference implementations add 1e-4 after a global key shift, which collapses to uniform
// attention at ordinary scales). Cost O(n·M·p); never n × n.
// Backward of L = ⟨G, out⟩ with the same ω (a_i = query features, N_i = a_i·KV, D_i = a_i·Σ_j φ(k_j)):
//   ∂L/∂a_im = (g_i·kv_m − (g_i·out_i)·ks_m)/D_i,  ∇_q_i = √s·Σ_m a_im·∂L/∂a_im·ω_m,
//   ∇_V = Φ_K·Σ_i (a_i/D_i)ᵀ g_i;  O(n·M·(p + pv)), float64.
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/random_features/performer_params.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

class Performer final : public Estimator {
 public:
  explicit Performer(PerformerParams params) : features_(params.features), orthogonal_(params.orthogonal) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const Forward f = forward(view, ctx);
    out = f.out.cast<float>();
  }

  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext& ctx) const override {
    const Forward f = forward(view, ctx);
    const VectorD g_dot_out = (upstream.array() * f.out.array()).rowwise().sum();
    MatrixD coefficient = upstream * f.kv.transpose();  // n × M: g_i·kv_m, then ∂L/∂a_im·a_im
    coefficient -= g_dot_out * f.key_sum.transpose();
    coefficient = (coefficient.array() * f.query_features.array()).colwise() / f.denominator.array();
    Gradients out;
    out.q = std::sqrt(view.scale) * coefficient * f.omegas;
    const MatrixD scaled_queries = f.query_features.array().colwise() / f.denominator.array();
    out.v = f.key_features * (scaled_queries.transpose() * upstream);
    return out;
  }

  // Â_ij = φ(q_i)·φ(k_j) / φ(q_i)·Σ_j′ φ(k_j′) (rows sum to one, entries positive), from the same ω as
  // estimate(). The features are formed here on their own (the per-row query shift and the one key shift
  // cancel in the ratio, as in estimate) so that this stays independent of how estimate() is evaluated.
  // Setup O(n·M·p); O(rows·keys·M) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "performer: attention weights under the causal mask are not stated yet");
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);  // M × p
    MatrixD query_logits = (root_scale * view.q) * omegas.transpose();              // n × M
    MatrixD key_features = log_features(root_scale * view.k, omegas);               // keys × M
    key_features = (key_features.array() - key_features.maxCoeff()).exp();
    VectorD key_sum = key_features.colwise().sum().transpose();
    return [query_logits = std::move(query_logits), key_features = std::move(key_features),
            key_sum = std::move(key_sum)](int64_t r0, int64_t rows) {
      MatrixD a = query_logits.middleRows(r0, rows);  // rows × M
      for (int64_t i = 0; i < rows; ++i) a.row(i).array() = (a.row(i).array() - a.row(i).maxCoeff()).exp();
      const VectorD denominator = a * key_sum;
      MatrixD w = a * key_features.transpose();  // rows × keys
      w.array().colwise() /= denominator.array();
      return w;
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * n * features_ * p + 2.0 * 2.0 * n * features_ * pv;
  }

  // ω (M × p), the query and key features (n × M each, float64), kv (M × pv) and the numerator.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double m = static_cast<double>(features_);
    return 8.0 * (m * p + 2.0 * n * m + m * pv + static_cast<double>(n) * pv + 2.0 * n * p);
  }

 private:
  struct Forward {
    MatrixD omegas;          ///< M × p
    MatrixD query_features;  ///< n × M, a_i up to a per-row factor that cancels
    MatrixD key_features;    ///< keys × M, φ(k_j) up to one factor that cancels
    MatrixD kv;              ///< M × pv: Σ_j φ(k_j)ᵀ v_j
    VectorD key_sum;         ///< M: Σ_j φ(k_j)
    VectorD denominator;     ///< n: a_i·key_sum
    MatrixD out;             ///< n × pv
  };

  Forward forward(const HeadView& view, const EstimateContext& ctx) const {
    const double root_scale = std::sqrt(view.scale);
    Forward f;
    f.omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);
    // Queries: ‖q̃‖²/2 and M^{-1/2} cancel in the ratio, so only ω·q̃ minus its row max remains.
    f.query_features = (root_scale * view.q) * f.omegas.transpose();
    for (int64_t i = 0; i < f.query_features.rows(); ++i)
      f.query_features.row(i).array() = (f.query_features.row(i).array() - f.query_features.row(i).maxCoeff()).exp();
    f.key_features = log_features(root_scale * view.k, f.omegas);
    f.key_features = (f.key_features.array() - f.key_features.maxCoeff()).exp();
    f.kv = f.key_features.transpose() * view.v;
    f.key_sum = f.key_features.colwise().sum().transpose();
    f.denominator = f.query_features * f.key_sum;
    f.out = (f.query_features * f.kv).array().colwise() / f.denominator.array();
    return f;
  }

  int64_t features_;
  bool orthogonal_;
};

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "performer",
    .family = "random-features",
    .summary = "Performer/RFA positive random features, log-space stabilised, no epsilon (O(n M p))",
    .params = {{"M", ParamKind::kInt, "64", 1, 1 << 20, {}, "random features"},
               {"ortho", ParamKind::kInt, "1", 0, 1, {}, "1: orthogonal blocks of features (norms ~ chi_p); 0: iid"}},
    .samples_knob = "M",
    .random = true,
    .target = nullptr,
    .weights = true,
    .backward = "out",
    .ablations = {"performer(ortho=0)"},
    .make = [](const Spec& spec) { return std::make_unique<Performer>(PerformerParams::from_spec(spec)); },
});

}  // namespace
}  // namespace attnprobe
