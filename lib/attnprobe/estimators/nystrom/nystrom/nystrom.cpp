#include "attnprobe/estimators/nystrom/nystrom/nystrom.h"

#include <Eigen/Eigenvalues>
#include <Eigen/SVD>
#include <functional>
#include <limits>
#include <memory>

#include "attnprobe/common/rounding.h"
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
// one symmetric eigensolver instead of 24 L × L float64 products (40 → 11 ms at L = 256). For the float64
// forms, reference() and weights(); the estimate runs the float32 products (newton_schulz_f32).
//
// Two eigensolvers, by the width `thin_cols` of the block the result will be applied to (pv):
// - thin_cols ≤ L/2 (L = 256, pv = 64): U stays in factored form (SymmetricSpectrum) and is applied to
//   K3·V without being formed, nor K2ᵀ·U (1.2–1.5× faster calls at L = 256, n ≤ 4096);
// - otherwise (L = 64): forming U costs no more than applying its factors twice to pv ≥ L/2 columns, and
//   Eigen's SelfAdjointEigenSolver, which forms it, is the faster of the two at this size.
// c of Z₀ = c·K2ᵀ: 1 / (max column sum · max row sum) of this slice's |K2|. Both evaluations start here.
double newton_schulz_start(const MatrixD& k2) {
  return 1.0 / (k2.cwiseAbs().colwise().sum().maxCoeff() * k2.cwiseAbs().rowwise().sum().maxCoeff());
}

PseudoInverse newton_schulz_pinv(const MatrixD& k2, int steps, int64_t thin_cols) {
  const int64_t size = k2.rows();
  const auto filter = [&](const Eigen::ArrayXd& eigenvalues) {
    const Eigen::ArrayXd lambda = eigenvalues.max(0.0);  // M is PSD; clip rounding below 0
    Eigen::ArrayXd g = Eigen::ArrayXd::Constant(size, newton_schulz_start(k2));
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

// out = a·b on the pool, in blocks of kProductRows rows of a (whole, on one thread), then finish(r0, rows)
// on each block while it is in cache (on one thread, after the product). tile_product_assign computes each
// row of out as the same FMA chains whichever rows it is computed with, and finish works element by
// element, so the bits do not depend on the pool. 64 rows: L = 256 splits evenly over two threads (blocks
// of 48 left one thread 144 rows, the other 112), and a multiple of 4 leaves no 2-row tile (blocks of 32
// did: one thread ~5% slower).
void pooled_product(const MatrixF& a, const MatrixF& b, MatrixF& out, ThreadPool* pool,
                    const std::function<void(int64_t, int64_t)>& finish) {
  constexpr int64_t kProductRows = 64;
  if (pool == nullptr || pool->size() == 1) {
    tile_product(a, b, out);
    finish(0, out.rows());
    return;
  }
  out.resize(a.rows(), b.cols());
  for_each_index(pool, (a.rows() + kProductRows - 1) / kProductRows, [&](int64_t block) {
    const int64_t r0 = block * kProductRows, rows = std::min(kProductRows, a.rows() - r0);
    tile_product_assign(a.data() + r0 * a.cols(), a.cols(), rows, a.cols(), b.data(), b.cols(), b.cols(),
                        out.data() + r0 * out.cols(), out.cols());
    finish(r0, rows);
  });
}

// pooled_product for a square product that is symmetric in exact arithmetic, the iteration's A·T and A·T′
// (polynomials in A = K2·Z = M·g(M), M = K2·K2ᵀ): only the column blocks up to each row block's diagonal
// are computed and the rest mirrored from them (in 64-row blocks, 62.5% of the flops at L = 256), then
// finish runs on the whole rows. A itself is formed whole: mirrored too, it differed from K2·Z by the
// float32 iterate's drift from its exact form, and the estimate's error against the float64 evaluation
// grew up to 2.6× (4.4e-6 at L = 256 on charlm-hd32, 1,376 slice-cases; 1.96e-6 mirroring A·T and A·T′
// only, 1.88e-6 mirroring nothing). Mirrored entries equal their transposes exactly. The same bits on any
// pool: three regions (the products, the mirror, finish), each entry written by one rule.
void pooled_symmetric_product(const MatrixF& a, const MatrixF& b, MatrixF& out, ThreadPool* pool,
                              const std::function<void(int64_t, int64_t)>& finish) {
  constexpr int64_t kProductRows = 64;
  const int64_t size = a.rows(), blocks = (size + kProductRows - 1) / kProductRows;
  out.resize(size, size);
  const auto rows_of = [&](int64_t block) { return std::min(kProductRows, size - block * kProductRows); };
  // The last row blocks have the most columns: claimed first, so that two threads end together.
  for_each_index(pool, blocks, [&](int64_t item) {
    const int64_t block = blocks - 1 - item, r0 = block * kProductRows, rows = rows_of(block);
    tile_product_assign(a.data() + r0 * a.cols(), a.cols(), rows, a.cols(), b.data(), b.cols(), r0 + rows,
                        out.data() + r0 * size, size);
  });
  // The mirror in 16 × 16 register transposes (an element-wise loop's strided stores cost as much as the
  // products it saved), through a per-thread buffer; ×1 leaves every value as it is.
  for_each_index(pool, blocks, [&](int64_t block) {
    const int64_t r0 = block * kProductRows, rows = rows_of(block), rest = size - r0 - rows;
    if (rest == 0) return;
    thread_local MatrixF mirrored;  // rows × rest
    transpose_scaled(out.block(r0 + rows, r0, rest, rows), 1.0f, mirrored);
    out.block(r0, r0 + rows, rows, rest) = mirrored;
  });
  for_each_index(pool, blocks, [&](int64_t block) { finish(block * kProductRows, rows_of(block)); });
}

// The iterate before the last step, Z (L × L), and A = K2·Z: the last step is applied to the block it is
// for (last_step), as 4 products with its pv columns instead of 3 L × L ones and a fourth with pv.
struct NewtonSchulzF32 {
  MatrixF z, a;
};

// Rows [r0, r0 + rows) of `to` ← c·W − those rows of `from` (which may be `to`), W the identity (w null)
// or the block w.
auto subtracted_from(float c, const MatrixF* w, const MatrixF& from, MatrixF& to) {
  return [c, w, &from, &to](int64_t r0, int64_t rows) {
    if (w != nullptr) {
      to.middleRows(r0, rows) = c * w->middleRows(r0, rows) - from.middleRows(r0, rows);
      return;
    }
    to.middleRows(r0, rows) = -from.middleRows(r0, rows);
    for (int64_t i = r0; i < r0 + rows; ++i) to(i, i) += c;
  };
}

// One step once t = 7W − A·W is formed: ¼·Z·(13W − A·(15W − A·t)). W is the identity (w null) in the
// steps that form the next Z, where A·t and A·t′ are polynomials in A and so symmetric, or the block w in
// the last step, applied to K3·V (last_step).
MatrixF rest_of_step(const MatrixF& a, const MatrixF& z, MatrixF t, const MatrixF* w, ThreadPool* pool) {
  const auto product = w == nullptr ? &pooled_symmetric_product : &pooled_product;
  MatrixF next;
  product(a, t, next, pool, subtracted_from(15.0f, w, next, next));
  product(a, next, t, pool, subtracted_from(13.0f, w, t, t));
  pooled_product(z, t, next, pool, [&](int64_t r0, int64_t rows) { next.middleRows(r0, rows) *= 0.25f; });
  return next;
}

// The estimate's pseudo-inverse: the same six steps written out, Z ← ¼·Z·(13I − A(15I − A(7I − A))) with
// A = K2·Z, in float32 on the tile kernel (on the pool: row blocks of each product): all but the last
// step here, the last one applied to K3·V by last_step. Measured against the float64 spectrum (newton_schulz_pinv) on
// one Zen 5 core: at L = 64 the 24 products take ~60 µs where Eigen's eigensolver alone took 113 µs (its tridiagonal QR
// is a chain of dependent divisions and square roots; Nyström(64) at n = 1024 0.364 → 0.260 ms per call); at L = 256
// the whole call took the same time either way (n = 1024: 4.29 / 4.25 ms, 4096: 6.54 / 6.31 ms), and the products,
// unlike the eigensolver, split over the pool's threads. Float32 is enough although K2 is badly conditioned: the
// polynomial stays bounded (r(y) ≤ 13/4 on its unconverged directions, so rounding grows by at most (13/4)⁶ ≈ 1.2e3
// relative to ‖Z‖), and against the float64 spectral form the whole estimate moved by 3e-8 to 1.3e-6 relative on
// Gaussian heads and on the heads of all five dumps (charlm-hd32/64, stories260K at cond(K2) up to 4e19, kwt1-speech,
// sasrec-ml1m), L = 64 and 256: the size of the float32 passes' own rounding.
NewtonSchulzF32 newton_schulz_f32(const MatrixD& k2, int steps, ThreadPool* pool) {
  const MatrixF k = k2.cast<float>();
  NewtonSchulzF32 out{(newton_schulz_start(k2) * k2.transpose()).cast<float>(), MatrixF()};
  for (int step = 0; step + 1 < steps; ++step) {
    MatrixF t(k.rows(), k.rows());
    pooled_product(k, out.z, out.a, pool, subtracted_from(7.0f, nullptr, out.a, t));  // A = K2·Z, t = 7I − A
    out.z = rest_of_step(out.a, out.z, std::move(t), nullptr, pool);
  }
  pooled_product(k, out.z, out.a, pool, [](int64_t, int64_t) {});
  return out;
}

// The last step applied to w (L × pv): ¼·Z·(13w − A(15w − A(7w − A·w))), the six-step Z times w.
MatrixF last_step(const NewtonSchulzF32& state, const MatrixF& w, ThreadPool* pool) {
  MatrixF t;
  pooled_product(state.a, w, t, pool, subtracted_from(7.0f, &w, t, t));
  return rest_of_step(state.a, state.z, std::move(t), &w, pool);
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
  static constexpr int kSteps = 6;  ///< Newton–Schulz steps (the paper's)
  /// Landmarks from which the estimate's iteration runs its products on the pool (see estimate()).
  static constexpr int64_t kPooledIteration = 128;

 public:
  explicit Nystrom(const NystromParams& params) : landmarks_(params.landmarks), exact_pinv_(params.exact_pinv) {}

  // Float32 in two softmax-attention passes, K3·V = attention of the L landmark queries over all keys
  // and out = attention of the n queries over the L landmark keys with values pinv(K2)·(K3·V): the
  // exact kernels on the call's pool, never an n × L matrix. K2 stays float64; its pseudo-inverse is the
  // float32 iteration (newton_schulz_f32, which says why float32 is enough). pinv=exact runs in float64
  // throughout: its SVD inverts
  // singular values down to L·ε·σ_max, which multiplies float32 rounding of K3·V by up to 1e13 (1.5e-5
  // relative in the output at n = 300, L = 64, against 1e-7 for the six Newton–Schulz steps, whose
  // polynomial stays bounded).
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    if (below_float32(ctx.precision)) return estimate_rounded(view, ctx, out);
    if (exact_pinv_) {
      out = compute(view).cast<float>();
      return;
    }
    const Landmarks marks = landmarks(view.qf, view.kf, ctx.pool);
    const float scale = static_cast<float>(view.scale);
    const MatrixF q_bar = marks.q_bar.cast<float>(), k_bar = marks.k_bar.cast<float>();
    // pinv(K2) by the float32 iteration (newton_schulz_f32). Small (L′ < kPooledIteration), or without a
    // second thread, it is one more item of the K3·V pass, so a second thread takes key chunks meanwhile; from
    // L′ = kPooledIteration on (L = 256: 21 products of up to ~0.15 ms) its products go on the pool first. The same
    // bits either way.
    const bool pooled = ctx.pool != nullptr && ctx.pool->size() > 1 && q_bar.rows() >= kPooledIteration;
    NewtonSchulzF32 iteration;  // all but the last step
    MatrixF k3_v;               // L × pv
    if (pooled) {
      iteration = newton_schulz_f32(k2(view, marks), kSteps, ctx.pool);
      key_chunked_attention_f32(q_bar, view.kf, view.vf, scale, nullptr, k3_v, nullptr, ctx.pool);
    } else {
      key_chunked_attention_f32(q_bar, view.kf, view.vf, scale, nullptr, k3_v, nullptr, ctx.pool,
                                [&] { iteration = newton_schulz_f32(k2(view, marks), kSteps, nullptr); });
    }
    const MatrixF values = last_step(iteration, k3_v, ctx.pool);  // pinv(K2)·(K3·V)
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
  // P·V each) and K2; with pinv=iterative the estimate's Newton–Schulz steps: 10 symmetric L′ × L′ products
  // counted by their lower triangles (pooled_symmetric_product computes a little more: whole 64-row blocks),
  // 11 general ones, and the last step's four with K3·V's pv columns; with pinv=exact pinv(K2) applied
  // through the SVD's factors (three L′ × L′ by L′ × pv products), its O(L′³) not counted.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double marks = static_cast<double>(std::min(landmarks_, n));
    const double passes = 2.0 * 2.0 * n * marks * (p + pv) + 2.0 * marks * marks * p;
    if (exact_pinv_) return passes + 3.0 * 2.0 * marks * marks * pv;
    const double symmetric = 2.0 * (kSteps - 1), full = 2.0 * (kSteps - 1) + 1.0;  // the iteration's products
    return passes + symmetric * marks * marks * (marks + 1.0) + full * 2.0 * marks * marks * marks +
           4.0 * 2.0 * marks * marks * pv;
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
  // Below float32 (its rounding declaration): what Nyströmformer's code computes with its tensors in the dtype. The
  // landmarks (segment means) and K2 = softmax(s·Q̄K̄ᵀ) are computed wider and stored; the two attention passes (the
  // landmark queries over all keys, the queries over the landmark keys) run at FlashAttention-2's points; the
  // iteration's every product and sum is accumulated in float32 and stored, as a matmul in the dtype does. Not blocked
  // or pooled: the emulation's cost is the study's, not a kernel's.
  void estimate_rounded(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const {
    const Precision dtype = ctx.precision;
    const auto stored = [dtype](MatrixF x) {
      round_in_place(x, dtype);
      return x;
    };
    const Landmarks marks = landmarks(view.qf, view.kf);
    const MatrixF q_bar = stored(marks.q_bar.cast<float>()), k_bar = stored(marks.k_bar.cast<float>());
    const float scale = static_cast<float>(view.scale);
    MatrixF k3_v;  // L′ × pv: softmax(s·Q̄Kᵀ)·V
    exact_attention_rounded(q_bar, view.kf, view.vf, scale, dtype, k3_v, ctx.pool, QueryGeometry{});
    MatrixD k2 = view.scale * (q_bar.cast<double>() * k_bar.cast<double>().transpose());
    softmax_rows(k2);
    const MatrixF k = stored(k2.cast<float>());
    MatrixF values;  // pinv(K2)·(K3·V)
    if (exact_pinv_) {
      values = stored(svd_pinv(k.cast<double>())(k3_v.cast<double>()).cast<float>());
    } else {
      const MatrixF identity = MatrixF::Identity(k.rows(), k.rows());
      MatrixF z = stored((newton_schulz_start(k.cast<double>()) * k.cast<double>().transpose()).cast<float>());
      // Z ← ¼·Z·(13I − A(15I − A(7I − A))), A = K2·Z; the last step applied to K3·V (W) as the float32 path does.
      for (int step = 0; step < kSteps; ++step) {
        const bool last = step + 1 == kSteps;
        const MatrixF w = last ? k3_v : identity;
        const MatrixF a = stored(k * z);
        MatrixF t = stored(7.0f * w - (last ? stored(a * w) : a));
        t = stored(15.0f * w - stored(a * t));
        t = stored(13.0f * w - stored(a * t));
        z = stored(0.25f * stored(z * t));
      }
      values = std::move(z);
    }
    exact_attention_rounded(view.qf, k_bar, values, scale, dtype, out, ctx.pool, QueryGeometry{});
  }

  // thin_cols: the width of the block the pseudo-inverse will be applied to (pv).
  PseudoInverse pseudo_inverse(const MatrixD& k2, int64_t thin_cols) const {
    return exact_pinv_ ? svd_pinv(k2) : newton_schulz_pinv(k2, kSteps, thin_cols);
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

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<NystromParams>{
    .name = "nystrom",
    .family = "nystrom",
    .summary = "Nystromformer: segment-mean landmarks, K1*pinv(K2)*(K3*V) (deterministic, O(n L p))",
    .page = "estimators/nystrom.md",
    .params = ParamSet<NystromParams>()
                  .integer("L", &NystromParams::landmarks, 1, 1 << 20,
                           "landmarks (segments); L >= n is exact with pinv=exact")
                  .choice("pinv", &NystromParams::exact_pinv, {{"iterative", false}, {"exact", true}},
                          "6 Newton-Schulz steps (the paper) or float64 SVD with a relative cutoff"),
    .samples_knob = "L",
    .capabilities = {.random = false,
                     .weights = kFullOnly,
                     .rounding = "landmarks (segment means) and K2 = softmax(s·Q̄K̄ᵀ) computed wider and stored in the "
                                 "precision; both attention passes (landmark queries over the keys, queries over the "
                                 "landmark keys) at FlashAttention-2's points; every product and sum of the "
                                 "Newton-Schulz iteration accumulated float32 and stored (pinv=exact: its float64 "
                                 "result stored); output rounded"},
    .make = [](const NystromParams& params) { return std::make_unique<Nystrom>(params); },
});

}  // namespace
}  // namespace attnprobe
