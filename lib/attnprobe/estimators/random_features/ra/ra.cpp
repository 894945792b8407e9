#include "attnprobe/estimators/random_features/ra/ra.h"

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/common/decode_blocks.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

class RandomizedAttention final : public Estimator {
 public:
  explicit RandomizedAttention(const RaParams& params)
      : samples_(params.samples), unbiased_(params.unbiased), raw_noise_(params.raw_noise) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), p = view.p();
    const MatrixD k_scaled = std::sqrt(view.scale) * view.k;
    const MatrixD centres = draw_centres(view, ctx);
    // The attention passes block their rows by the queries' absolute positions (a decode step's rows get the
    // whole slice's bits): sample s of row i is row i of a causal pass; row i·S + s of the full one. Below float32
    // (its rounding declaration) each pass is exact attention at FlashAttention-2's points: its inputs ω and
    // [k̃, −‖k̃‖²/2] stored, as the sample attention a GPU kernel runs on stored tensors, and its rows stored.

    // f(ω) for every (i, s) at once: [ω, 1]·[k̃, −‖k̃‖²/2]ᵀ with scale 1.
    MatrixF omega_aug(centres.rows(), p + 1), key_aug(view.keys(), p + 1);
    omega_aug.leftCols(p) = centres.cast<float>();
    omega_aug.col(p).setOnes();
    key_aug.leftCols(p) = k_scaled.cast<float>();
    key_aug.col(p) = (-0.5 * k_scaled.rowwise().squaredNorm()).cast<float>();
    if (view.mask == Mask::kCausal) {
      // One causal pass per sample: row i of sample s is ω_{i,s} over keys j ≤ i.
      out = MatrixF::Zero(n, view.pv());
      MatrixF omega_s(n, p + 1), per_sample;
      for (int64_t s = 0; s < samples_; ++s) {
        for (int64_t i = 0; i < n; ++i) omega_s.row(i) = omega_aug.row(i * samples_ + s);
        exact_attention_in(omega_s, key_aug, view.vf, 1.0f, ctx.precision, per_sample, ctx.pool, view.geometry());
        out += per_sample;
      }
      out /= static_cast<float>(samples_);
      return;
    }
    MatrixF per_sample;
    exact_attention_in(omega_aug, key_aug, view.vf, 1.0f, ctx.precision, per_sample, ctx.pool,
                       QueryGeometry{.first_position = view.first_position * samples_});
    out.resize(n, view.pv());
    for (int64_t i = 0; i < n; ++i) out.row(i) = per_sample.middleRows(i * samples_, samples_).colwise().mean();
  }

  // Â_ij = (1/S)·Σ_s softmax_j(ω_is·k̃_j − ‖k̃_j‖²/2): the mean of the S attention rows of the query's
  // samples (rows sum to one, entries positive), so that out_i = Σ_j Â_ij·v_j. The ω are those of
  // estimate() under the same key (draw_centres repeats its draws). Setup O(n²·p) for variant=unbiased
  // (the sampling rows), O(rows·S·keys·p) per block. Causal: the softmax over keys j ≤ i, with the causal
  // form's draws (draw_centres samples j* over j ≤ i).
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    const MatrixD k_scaled = std::sqrt(view.scale) * view.k;
    RowVectorD bias = -0.5 * k_scaled.rowwise().squaredNorm().transpose();
    return [&view, omegas = draw_centres(view, ctx), k_scaled, bias = std::move(bias), samples = samples_](
               int64_t r0, int64_t rows) {
      MatrixD logits = omegas.middleRows(r0 * samples, rows * samples) * k_scaled.transpose();  // rows·S × keys
      logits.rowwise() += bias;
      const int64_t keys = logits.cols();
      for (int64_t r = 0; r < logits.rows(); ++r) {  // row r is query r0 + r / S; causal: keys 0..i only
        const int64_t seen = view.visible(r0 + r / samples).end;
        auto head = logits.row(r).head(seen);
        head.array() = (head.array() - head.maxCoeff()).exp();
        head /= head.sum();
        logits.row(r).tail(keys - seen).setZero();  // exactly: Eigen's vectorised exp(−inf) is ~1e-308, not 0
      }
      MatrixD w(rows, k_scaled.rows());
      for (int64_t i = 0; i < rows; ++i)
        w.row(i) = logits.middleRows(i * samples, samples).colwise().sum() / static_cast<double>(samples);
      return w;
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return samples_ * (2.0 * n * n * (p + 1) + 2.0 * n * n * pv) + 2.0 * n * n * p;
  }

 private:
  // ω_{i,s} (row i·S + s, n·S × p), for estimate() and weights() alike. Centres: q̃_i + k̃_{j*}
  // (j* ~ π_i, one per sample) or q̃_i + Σ_j π_i(j)·k̃_j, over j ≤ t_i under the causal mask; then the noise.
  // Draws are keyed by the row's position t_i, and the blocks of π's logits cut at absolute positions (a first
  // one led by zero rows, decode_blocks.h), so a row draws the same ω whichever rows are evaluated.
  MatrixD draw_centres(const HeadView& view, const EstimateContext& ctx) const {
    const int64_t n = view.n(), p = view.p();
    const double root_scale = std::sqrt(view.scale);
    const MatrixD q_scaled = root_scale * view.q, k_scaled = root_scale * view.k;
    const double noise_std = raw_noise_ ? root_scale : 1.0;
    MatrixD centres(n * samples_, p);
    if (unbiased_) {
      // j* ~ π_i: the logits of a block of queries in float32 (one GEMM), exponentiated row-wise
      // (vectorised; a scalar exp over all n² logits cost 5× the exact attention time).
      const RandomStream draw(ctx.key, Purpose::kRowSample);
      const int64_t block = 64;
      const MatrixF q_f = q_scaled.cast<float>(), k_f = k_scaled.cast<float>();
      const int64_t keys = view.keys();
      MatrixF logits(block, keys);
      std::vector<double> probs(keys);
      for (int64_t r0 = 0; r0 < n;) {
        const auto [rows, lead] = aligned_block(view.position(r0), n - r0, block);
        const int64_t cols = view.visible(r0 + rows - 1).end;
        if (lead == 0)
          logits.topRows(rows).leftCols(cols).noalias() = q_f.middleRows(r0, rows) * k_f.topRows(cols).transpose();
        else
          logits.topRows(lead + rows).leftCols(cols).noalias() =
              with_lead(q_f, r0, rows, lead) * k_f.topRows(cols).transpose();
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t seen = view.visible(r0 + r).end;  // causal: j* ~ π_i over j ≤ t_i
          auto row = logits.row(lead + r).head(seen);
          row.array() = (row.array() - row.maxCoeff()).exp();
          probs.resize(seen);
          for (int64_t j = 0; j < seen; ++j) probs[j] = row(j);
          const auto picked =
              sample_with_replacement(probs, samples_, draw, static_cast<uint32_t>(view.position(r0 + r)));
          for (int64_t s = 0; s < samples_; ++s)
            centres.row((r0 + r) * samples_ + s) = q_scaled.row(r0 + r) + k_scaled.row(picked[s]);
        }
        r0 += rows;
      }
    } else {
      MatrixF mean_key;  // Σ_j π_i(j)·k̃_j: attention with values k̃ (below float32 at FlashAttention-2's points)
      exact_attention_in(view.qf, view.kf, k_scaled.cast<float>(), static_cast<float>(view.scale), ctx.precision,
                         mean_key, nullptr, view.geometry());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t s = 0; s < samples_; ++s)
          centres.row(i * samples_ + s) = q_scaled.row(i) + mean_key.row(i).cast<double>();
    }
    const RandomStream noise(ctx.key, Purpose::kNoise);
    RowVectorD eps(p);
    for (int64_t r = 0; r < centres.rows(); ++r) {
      noise.normals(static_cast<uint32_t>(view.position(r / samples_) * samples_ + r % samples_), 0, eps.data(), p);
      centres.row(r) += noise_std * eps;
    }
    return centres;
  }

  int64_t samples_;
  bool unbiased_, raw_noise_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<RaParams>{
    .name = "ra",
    .family = "random-features",
    .summary = "randomized attention: f(omega) averaged over S samples of omega around q+k (O(n^2 p S))",
    .page = "estimators/random-features.md",
    .params = ParamSet<RaParams>()
                  .integer("S", &RaParams::samples, 1, 4096, "samples per query")
                  .choice("variant", &RaParams::unbiased, {{"unbiased", true}, {"biased", false}},
                          "unbiased: omega = q + k_j*, j* ~ softmax row (Prop. 3.2); biased: omega = q + E_pi[k]")
                  .choice("noise", &RaParams::raw_noise, {{"scaled", false}, {"raw", true}},
                          "scaled: eps ~ N(0,I) in the scaled space (paper); raw: std sqrt(s) as the reference code "
                          "(biased)"),
    .samples_knob = "S",
    .capabilities = {.random = true,
                     .forms = kFullAndCausal,
                     .decode = kFullAndCausal,
                     .weights = kFullAndCausal,
                     .rounding =
                         "each sample's attention pass at FlashAttention-2's points (softmax's) over its stored "
                         "inputs: the samples ω, the keys [√s·k, −s‖k‖²/2] and the values; the mean of the S "
                         "stored rows accumulated float32; variant=unbiased draws j* from float32 logits of the "
                         "rounded inputs, variant=biased takes E_π[k̃] from exact attention at "
                         "FlashAttention-2's points; output rounded"},
    .make = [](const RaParams& params) { return std::make_unique<RandomizedAttention>(params); },
});

}  // namespace
}  // namespace attnprobe
