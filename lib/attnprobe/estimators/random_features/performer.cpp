// performer(M, ortho) — RFA / Performer positive random features (Choromanski et al., ICLR 2021;
// Peng et al., ICLR 2021; docs/estimators/random-features.md). Target: softmax.
//   φ(x) = M^{-1/2}·[ξ(x, ω_1) … ξ(x, ω_M)],  out_i = φ(q_i)·(Σ_j φ(k_j)ᵀ v_j) / (φ(q_i)·Σ_j φ(k_j)).
// φ(q)·φ(k) is unbiased for exp(s·q·k) (tested); the ratio is consistent, not unbiased. Log space:
// a per-row shift for queries and one shift per slice for keys cancel exactly; no epsilon is added
// (the reference implementations add 1e-4 after a global key shift, which collapses to uniform
// attention at ordinary scales). Cost O(n·M·p); never n × n.
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/random_features/performer_params.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

class Performer final : public Estimator {
 public:
  explicit Performer(PerformerParams params) : features_(params.features), orthogonal_(params.orthogonal) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);
    // Queries: ‖q̃‖²/2 and M^{-1/2} cancel in the ratio, so only ω·q̃ minus its row max remains.
    MatrixD query_features = (root_scale * view.q) * omegas.transpose();
    for (int64_t i = 0; i < query_features.rows(); ++i)
      query_features.row(i).array() = (query_features.row(i).array() - query_features.row(i).maxCoeff()).exp();
    MatrixD key_features = log_features(root_scale * view.k, omegas);
    key_features = (key_features.array() - key_features.maxCoeff()).exp();
    const MatrixD kv = key_features.transpose() * view.v;              // M × pv
    const VectorD key_sum = key_features.colwise().sum().transpose();  // M
    const MatrixD numerator = query_features * kv;
    const VectorD denominator = query_features * key_sum;
    out = (numerator.array().colwise() / denominator.array()).matrix().cast<float>();
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
    .ablations = {"performer(ortho=0)"},
    .make = [](const Spec& spec) { return std::make_unique<Performer>(PerformerParams::from_spec(spec)); },
});

}  // namespace
}  // namespace attnprobe
