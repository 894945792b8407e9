// nystrom(L, pinv) — Nyströmformer (Xiong et al., AAAI 2021), the shared baseline of the three
// papers (docs/estimators/nystrom.md). Deterministic. Target: softmax.
//   q̄, k̄ = means of L contiguous segments of Q and K (landmarks);
//   K1 = softmax(s·Q k̄ᵀ) (n × L), K2 = softmax(s·q̄ k̄ᵀ) (L × L), K3 = softmax(s·q̄ Kᵀ) (L × n);
//   out = K1 · pinv(K2) · (K3 · V).
// pinv=iterative: 6 Newton–Schulz steps Z ← ¼·Z·(13I − K2Z(15I − K2Z(7I − K2Z))) from
// Z₀ = K2ᵀ / (max column sum · max row sum) of this slice's K2 (the reference code takes one max over
// the whole batch, a reported bug). pinv=exact: SVD in float64 with a relative singular-value
// cutoff (K2 reaches condition numbers of 1e18 on real dumps). With L = n the landmarks are the
// tokens, K1 = K2 = K3 = B and B·B⁺·B = B: exact (pinv=exact). The small L × L work is float64.
#include <limits>

#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

MatrixD newton_schulz_pinv(const MatrixD& k2, int steps) {
  const int64_t l = k2.rows();
  const double max_col = k2.cwiseAbs().colwise().sum().maxCoeff();
  const double max_row = k2.cwiseAbs().rowwise().sum().maxCoeff();
  MatrixD z = k2.transpose() / (max_col * max_row);
  const MatrixD identity = MatrixD::Identity(l, l);
  for (int step = 0; step < steps; ++step) {
    const MatrixD kz = k2 * z;
    z = 0.25 * z * (13.0 * identity - kz * (15.0 * identity - kz * (7.0 * identity - kz)));
  }
  return z;
}

MatrixD svd_pinv(const MatrixD& k2) {
  Eigen::BDCSVD<MatrixD> svd(k2, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const auto& sigma = svd.singularValues();
  // numpy's default cutoff: max(L, L)·eps·σ_max.
  const double cutoff = static_cast<double>(k2.rows()) * std::numeric_limits<double>::epsilon() * sigma(0);
  Eigen::VectorXd inverse(sigma.size());
  for (int64_t i = 0; i < sigma.size(); ++i) inverse(i) = sigma(i) > cutoff ? 1.0 / sigma(i) : 0.0;
  return svd.matrixV() * inverse.asDiagonal() * svd.matrixU().transpose();
}

class Nystrom final : public Estimator {
 public:
  Nystrom(int64_t landmarks, bool exact_pinv) : landmarks_(landmarks), exact_pinv_(exact_pinv) {}

  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out = compute(view).cast<float>();
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override { return compute(view); }
  // Â = K1·pinv(K2)·K3 (rows may be negative: the pseudo-inverse does not keep weights positive).
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    Factors f = factors(view);
    return [k1 = std::move(f.k1), right = MatrixD(f.pinv * f.k3)](int64_t r0, int64_t rows) {
      return MatrixD(k1.middleRows(r0, rows) * right);
    };
  }

 private:
  struct Factors {
    MatrixD k1, pinv, k3;  ///< n × L, L × L, L × n
  };
  Factors factors(const HeadView& view) const {
    const auto segments = contiguous_segments(view.n(), landmarks_);
    const MatrixD q_bar = segment_means(view.q, segments), k_bar = segment_means(view.k, segments);
    MatrixD k1 = view.scale * (view.q * k_bar.transpose());
    MatrixD k2 = view.scale * (q_bar * k_bar.transpose());
    MatrixD k3 = view.scale * (q_bar * view.k.transpose());
    softmax_rows(k1);
    softmax_rows(k2);
    softmax_rows(k3);
    MatrixD pinv = exact_pinv_ ? svd_pinv(k2) : newton_schulz_pinv(k2, 6);
    return {std::move(k1), std::move(pinv), std::move(k3)};
  }
  // float64 throughout: O(n·L·p), the products are small next to exact attention.
  MatrixD compute(const HeadView& view) const {
    const Factors f = factors(view);
    return f.k1 * (f.pinv * (f.k3 * view.v));
  }

  int64_t landmarks_;
  bool exact_pinv_;
};

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "nystrom",
    .family = "nystrom",
    .summary = "Nystromformer: segment-mean landmarks, K1*pinv(K2)*(K3*V) (deterministic, O(n L p))",
    .params = {{"L", ParamKind::kInt, "64", 1, 1 << 20, {}, "landmarks (segments); L >= n is exact with pinv=exact"},
               {"pinv",
                ParamKind::kChoice,
                "iterative",
                0,
                0,
                {"iterative", "exact"},
                "6 Newton-Schulz steps (the paper) or float64 SVD with a relative cutoff"}},
    .samples_knob = "L",
    .random = false,
    .target = nullptr,
    .weights = true,
    .make =
        [](const Spec& spec) {
          return std::make_unique<Nystrom>(spec.get_int("L"), spec.get_choice("pinv") == "exact");
        },
});

}  // namespace
}  // namespace attnprobe
