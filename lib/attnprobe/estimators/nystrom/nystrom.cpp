// nystrom(L, pinv) — Nyströmformer (Xiong et al., AAAI 2021), the shared baseline of the three
// papers (docs/estimators/nystrom.md). Deterministic. Target: softmax.
//   q̄, k̄ = means of L contiguous segments of Q and K (landmarks);
//   K1 = softmax(s·Q k̄ᵀ) (n × L), K2 = softmax(s·q̄ k̄ᵀ) (L × L), K3 = softmax(s·q̄ Kᵀ) (L × n);
//   out = K1 · pinv(K2) · (K3 · V).
// pinv=iterative: 6 Newton–Schulz steps Z ← ¼·Z·(13I − K2Z(15I − K2Z(7I − K2Z))) (evaluated on the
// spectrum of K2·K2ᵀ, newton_schulz_pinv below) from
// Z₀ = K2ᵀ / (max column sum · max row sum) of this slice's K2 (the reference code takes one max over
// the whole batch, a reported bug). pinv=exact: SVD in float64 with a relative singular-value
// cutoff (K2 reaches condition numbers of 1e18 on real dumps). With L = n the landmarks are the
// tokens, K1 = K2 = K3 = B and B·B⁺·B = B: exact (pinv=exact). The estimate is float32 in two
// softmax-attention passes on the exact kernels (K3·V, then K1·(pinv(K2)·K3·V)); K2 and its
// pseudo-inverse are float64 (L × L); with pinv=exact everything is (see estimate()). reference() is
// float64 throughout.
#include <functional>
#include <limits>
#include <memory>

#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/common/symmetric_spectrum.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {
namespace {

/// w ↦ pinv(K2)·w on L × cols blocks, applied through pinv's factors (never an L × L product).
using PseudoInverse = std::function<MatrixD(const MatrixD&)>;

// Newton–Schulz, Z ← ¼·Z·(13I − K2Z(15I − K2Z(7I − K2Z))) from Z₀ = c·K2ᵀ, keeps Z = K2ᵀ·g(M) with
// M = K2·K2ᵀ (symmetric): then K2Z = M·g(M), and each step is g ← g·r(x·g) with r(y) = ¼(13 − y(15 −
// y(7 − y))), a scalar map on M's eigenvalues. So the steps are evaluated on the spectrum, M = U·Λ·Uᵀ,
// Z·w = K2ᵀ·U·diag(g(Λ))·Uᵀ·w: equal to the literal iteration in exact arithmetic (tested against it
// at cond(K2) ≈ 1e9: 3.0e-16 relative with Eigen's eigensolver, 3.3e-16 with SymmetricSpectrum), and
// one symmetric eigensolver instead of 24 L × L products (40 → 11 ms at L = 256).
//
// Two eigensolvers, by the width `thin_cols` of the block the result will be applied to (pv):
// - thin_cols ≤ L/2 (L = 256, pv = 64): U stays in factored form (SymmetricSpectrum) and is applied to
//   K3·V without being formed, nor K2ᵀ·U (1.2–1.5× faster calls at L = 256, n ≤ 4096);
// - otherwise (L = 64): forming U costs no more than applying its factors twice to pv ≥ L/2 columns, and
//   Eigen's SelfAdjointEigenSolver, which forms it, is the faster of the two at this size.
PseudoInverse newton_schulz_pinv(const MatrixD& k2, int steps, int64_t thin_cols) {
  const int64_t size = k2.rows();
  const double max_col = k2.cwiseAbs().colwise().sum().maxCoeff();
  const double max_row = k2.cwiseAbs().rowwise().sum().maxCoeff();
  const auto filter = [&](const Eigen::ArrayXd& eigenvalues) {
    const Eigen::ArrayXd lambda = eigenvalues.max(0.0);  // M is PSD; clip rounding below 0
    Eigen::ArrayXd g = Eigen::ArrayXd::Constant(size, 1.0 / (max_col * max_row));
    for (int step = 0; step < steps; ++step) {
      const Eigen::ArrayXd y = lambda * g;
      g *= 0.25 * (13.0 - y * (15.0 - y * (7.0 - y)));
    }
    return VectorD(g.matrix());
  };
  Eigen::MatrixXd m = Eigen::MatrixXd::Zero(size, size);
  m.selfadjointView<Eigen::Lower>().rankUpdate(k2);  // the triangle both eigensolvers read: half the flops
  if (2 * thin_cols > size) {
    const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> spectrum(m);
    return [left = MatrixD(k2.transpose() * spectrum.eigenvectors()), right = MatrixD(spectrum.eigenvectors()),
            g = filter(spectrum.eigenvalues().array())](const MatrixD& w) {
      return MatrixD(left * (g.asDiagonal() * (right.transpose() * w)));
    };
  }
  auto spectrum = std::make_shared<const SymmetricSpectrum>(m);
  return [k2_t = MatrixD(k2.transpose()), spectrum, g = filter(spectrum->eigenvalues().array())](const MatrixD& w) {
    if (2 * w.cols() <= k2_t.rows())
      return MatrixD(k2_t * spectrum->from_eigenbasis(g.asDiagonal() * spectrum->to_eigenbasis(w)));
    // A wide block (the weights' K3, L × n): U formed once, in one pass of the rotations over L columns.
    const MatrixD u = spectrum->eigenvectors();
    return MatrixD(k2_t * (u * (g.asDiagonal() * (u.transpose() * w))));
  };
}

// The same six steps written out, Z ← ¼·Z·(13I − A(15I − A(7I − A))) with A = K2·Z, in float32 on the
// tile kernel: pinv(K2) = Z as an L × L matrix. For the estimate at L < 2·pv (L = 64, pv = 64), where the
// float64 spectrum costs more than the 24 products: Eigen's eigensolver takes 113 µs at L = 64 (its
// tridiagonal QR is a chain of dependent divisions and square roots), the products ~60 µs, a third of a
// Nyström(64) call at n = 1024 before. Float32 is enough here although K2 is badly conditioned: the
// polynomial stays bounded (r(y) ≤ 13/4 on its unconverged directions, so rounding grows by at most
// (13/4)⁶ ≈ 1.2e3 relative to ‖Z‖), and against the float64 spectral form the whole estimate moved by
// 3e-8 to 1.3e-6 relative on Gaussian heads and on the heads of all five dumps (charlm-hd32/64, stories260K
// at cond(K2) up to 4e19, kwt1-speech, sasrec-ml1m), the size of the float32 passes' own rounding.
MatrixF newton_schulz_f32(const MatrixD& k2, int steps) {
  const double max_col = k2.cwiseAbs().colwise().sum().maxCoeff();
  const double max_row = k2.cwiseAbs().rowwise().sum().maxCoeff();
  const MatrixF k = k2.cast<float>();
  MatrixF z = (k2.transpose() / (max_col * max_row)).cast<float>();
  MatrixF a, t, next;
  // t ← c·I − a·t, in place of t (a product into `next`, then swapped).
  const auto shifted_product = [&](float c, const MatrixF& left, MatrixF& right) {
    tile_product(left, right, next);
    next = -next;
    next.diagonal().array() += c;
    std::swap(right, next);
  };
  for (int step = 0; step < steps; ++step) {
    tile_product(k, z, a);
    t = -a;
    t.diagonal().array() += 7.0f;
    shifted_product(15.0f, a, t);
    shifted_product(13.0f, a, t);
    tile_product(z, t, next);
    z = 0.25f * next;
  }
  return z;
}

PseudoInverse svd_pinv(const MatrixD& k2) {
  Eigen::BDCSVD<MatrixD> svd(k2, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const auto& sigma = svd.singularValues();
  // numpy's default cutoff: max(L, L)·eps·σ_max.
  const double cutoff = static_cast<double>(k2.rows()) * std::numeric_limits<double>::epsilon() * sigma(0);
  VectorD inverse(sigma.size());
  for (int64_t i = 0; i < sigma.size(); ++i) inverse(i) = sigma(i) > cutoff ? 1.0 / sigma(i) : 0.0;
  return [v = MatrixD(svd.matrixV()), u = MatrixD(svd.matrixU()), inverse](const MatrixD& w) {
    return MatrixD(v * (inverse.asDiagonal() * (u.transpose() * w)));
  };
}

class Nystrom final : public Estimator {
 public:
  Nystrom(int64_t landmarks, bool exact_pinv) : landmarks_(landmarks), exact_pinv_(exact_pinv) {}

  // Float32 in two softmax-attention passes, K3·V = attention of the L landmark queries over all keys
  // and out = attention of the n queries over the L landmark keys with values pinv(K2)·(K3·V): the
  // exact kernels on the call's pool, never an n × L matrix. K2 and its pseudo-inverse stay float64
  // (L × L: cheap, and K2 is badly conditioned). pinv=exact runs in float64 throughout: its SVD inverts
  // singular values down to L·ε·σ_max, which multiplies float32 rounding of K3·V by up to 1e13 (1.5e-5
  // relative in the output at n = 300, L = 64, against 1e-7 for the six Newton–Schulz steps, whose
  // polynomial stays bounded).
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    if (exact_pinv_) {
      out = compute(view).cast<float>();
      return;
    }
    const Landmarks marks = landmarks(view.qf, view.kf, ctx.pool);
    const float scale = static_cast<float>(view.scale);
    const MatrixF q_bar = marks.q_bar.cast<float>(), k_bar = marks.k_bar.cast<float>();
    // The L × L pseudo-inverse (a float64 eigensolver: most of the call at L = 256 and n ≤ 4096) is one
    // more item of the K3·V pass, so a second thread takes key chunks meanwhile instead of waiting.
    // Below L = 2·pv the paper's iteration in float32 (newton_schulz_f32), from L = 2·pv the float64
    // spectrum applied through its factors.
    const bool literal = 2 * view.vf.cols() > q_bar.rows();
    MatrixF k3_v;  // L × pv
    MatrixF z;     // pinv(K2), when literal
    PseudoInverse pinv;
    key_chunked_attention_f32(q_bar, view.kf, view.vf, scale, nullptr, k3_v, nullptr, ctx.pool, [&] {
      if (literal)
        z = newton_schulz_f32(k2(view, marks), 6);
      else
        pinv = pseudo_inverse(k2(view, marks), view.vf.cols());
    });
    MatrixF values;
    if (literal)
      tile_product(z, k3_v, values);
    else
      values = apply_pinv(pinv, k3_v, ctx.pool);
    exact_attention_f32(view.qf, k_bar, values, scale, out, ctx.pool);
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override { return compute(view); }
  // Â = K1·pinv(K2)·K3 (rows may be negative: the pseudo-inverse does not keep weights positive).
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    Factors f = factors(view);
    return [k1 = std::move(f.k1), right = MatrixD(f.pinv(f.k3))](int64_t r0, int64_t rows) {
      return MatrixD(k1.middleRows(r0, rows) * right);
    };
  }

  // The two attention passes (n queries over L′ landmark keys, L′ landmark queries over n keys: logits and
  // P·V each), K2, and pinv(K2) applied to the L′ × pv block through its factors (three L′ × L′ by L′ × pv
  // products); the eigensolver's O(L′³) is not counted.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double marks = static_cast<double>(std::min(landmarks_, n));
    return 2.0 * 2.0 * n * marks * (p + pv) + 2.0 * marks * marks * p + 3.0 * 2.0 * marks * marks * pv;
  }

 private:
  struct Landmarks {
    MatrixD q_bar, k_bar;  ///< L′ × p segment means of Q and K
  };
  // From the float64 inputs (the reference) or the float32 ones (the estimate, see segment_means).
  template <class Input>
  Landmarks landmarks(const Input& q, const Input& k, ThreadPool* pool = nullptr) const {
    const auto segments = contiguous_segments(q.rows(), landmarks_);
    return {segment_means(q, segments, pool), segment_means(k, segments, pool)};
  }
  static MatrixD k2(const HeadView& view, const Landmarks& marks) {
    MatrixD k2 = view.scale * (marks.q_bar * marks.k_bar.transpose());  // L′ × L′
    softmax_rows(k2);
    return k2;
  }
  // pinv(K2)·w for the L′ × pv float32 w. On a pool of two or more threads, with the factored eigenvectors
  // (2·pv ≤ L′), the columns go in blocks of kApplyColumns, one pool item each: the reflections and rotations
  // applied there are ~2 ms at L = 256, pv = 64, serial between two parallel passes (1.6 → 1.85× on two
  // threads at n = 4096). Alone, the whole block at once: the per-block costs made one thread ~4% slower.
  // Both give the same bits: every step treats each column on its own, the rotations and the diagonal
  // element by element, and the products on Eigen's GEMM path, whose accumulation order along the depth
  // does not depend on the number of columns as long as the blocks are whole multiples of its 4-column
  // panels and none is a single column (a matrix–vector product); pv % kApplyColumns == 0 keeps them so.
  static MatrixF apply_pinv(const PseudoInverse& pinv, const MatrixF& w, ThreadPool* pool) {
    constexpr int64_t kApplyColumns = 32;
    const int64_t size = w.rows(), cols = w.cols();
    const bool blocks = pool != nullptr && pool->size() > 1 && 2 * cols <= size && cols % kApplyColumns == 0 &&
                        cols >= 2 * kApplyColumns;
    if (!blocks) return pinv(w.cast<double>()).cast<float>();
    MatrixF out(size, cols);
    for_each_index(pool, cols / kApplyColumns, [&](int64_t block) {
      const int64_t j0 = block * kApplyColumns;
      out.middleCols(j0, kApplyColumns) = pinv(w.middleCols(j0, kApplyColumns).cast<double>()).cast<float>();
    });
    return out;
  }
  // thin_cols: the width of the block the pseudo-inverse will be applied to (pv).
  PseudoInverse pseudo_inverse(const MatrixD& k2, int64_t thin_cols) const {
    return exact_pinv_ ? svd_pinv(k2) : newton_schulz_pinv(k2, 6, thin_cols);
  }

  struct Factors {
    MatrixD k1;          ///< n × L′
    PseudoInverse pinv;  ///< of K2 (L′ × L′)
    MatrixD k3;          ///< L′ × n
  };
  Factors factors(const HeadView& view) const {
    const Landmarks marks = landmarks(view.q, view.k);
    MatrixD k1 = view.scale * (view.q * marks.k_bar.transpose());
    MatrixD k3 = view.scale * (marks.q_bar * view.k.transpose());
    softmax_rows(k1);
    softmax_rows(k3);
    return {std::move(k1), pseudo_inverse(k2(view, marks), view.v.cols()), std::move(k3)};
  }
  // The float64 evaluation (the reference form): O(n·L′·p), small next to exact attention.
  MatrixD compute(const HeadView& view) const {
    const Factors f = factors(view);
    return f.k1 * f.pinv(f.k3 * view.v);
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
