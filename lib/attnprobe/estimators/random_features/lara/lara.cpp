#include "attnprobe/estimators/random_features/lara/lara.h"

#include "attnprobe/estimators/random_features/lara/mis_weights.h"
#include "attnprobe/estimators/random_features/lara/proposals.h"

#include <cmath>
#include <limits>
#include <numbers>

#include "attnprobe/common/error.h"
#include "attnprobe/common/prefetch.h"
#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {

namespace {

class Lara final : public Estimator {
 public:
  explicit Lara(const LaraParams& params) : params_(params) {}

  // The forward pass in float32, with no n × C matrix of its own when C ≤ pv: the same draws and weights as draw()
  // below (float64, whole n × C matrices; weights() uses it). The key-side sums are softmax attention of the
  // C "queries" ω̃_c over the keys k_j with bias −s‖k_j‖²/2 (f(ω_c) and log Σ_j ξ(k_j, ω_c)), run on the
  // chunked exact kernel over the call's pool. Then the queries in blocks of kRowBlock rows, twice:
  //  1. r′'s logits q̃_n·q̄̃_c, and per block the maximum and the sum of exps of each column c: r′ is a
  //     softmax over all queries n, so its normaliser must be known before any row's weights. The logits
  //     wait in the block's rows of `out` (C ≤ pv; else in an n × C buffer), which pass 2 overwrites. (A
  //     pass over the queries for the normalisers alone formed the same logits twice: 10–18% of a call at
  //     n = 1024 and 4096.)
  //  2. ξ's logits, the sample weights and the block's output.
  // The blocks are independent and combined in block order, so the bits do not depend on the thread count.
  // Everything stays O(n) in memory (fresh n × C float64 temporaries made the call superlinear past
  // n = 32768).
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), p = view.p(), pv = view.pv();
    const double root_scale = std::sqrt(view.scale);
    const auto segments = contiguous_segments(n, params_.proposals);
    const int64_t c_count = static_cast<int64_t>(segments.size());
    // Landmarks in the scaled space: the mean of √s·x is √s times the mean of x (from the float32
    // inputs, summed in float64: see segment_means). The keys' pass also gives their squared norms.
    VectorD key_squared_norms;
    const MatrixD q_bar = root_scale * segment_means(view.qf, segments, ctx.pool),
                  k_bar = root_scale * segment_means(view.kf, segments, ctx.pool, &key_squared_norms);
    // The noise's std in the scaled space; the densities below always use std 1 (see the header).
    const double draw_sigma = params_.raw_noise ? root_scale : 1.0;

    // The scaled keys are needed by the attn and mixture proposals only (the default segment one forms none).
    MatrixD k;
    if (params_.proposal == LaraProposal::kAttn || params_.proposal == LaraProposal::kMixture) k = root_scale * view.k;
    const auto [log_pi, mu, omegas, log_q] = lara_proposals(params_, q_bar, k_bar, k, n, p, draw_sigma, ctx.key);
    const double log_norm = -0.5 * p * std::log(2 * std::numbers::pi);

    // √s folded into the C × p factors (ω̃_c·k̃_j = (√s·ω_c)·k_j), so the raw float32 rows are read as they are.
    // Columns 0..C−1 of the transposed factors: q̄̃_c·√s (r′'s logits), columns C..2C−1: ω_c·√s (log ξ(q_n, ω_c)
    // up to −‖q̃_n‖²/2).
    MatrixF factors(2 * c_count, p);
    factors.topRows(c_count) = (root_scale * q_bar).cast<float>();
    factors.bottomRows(c_count) = (root_scale * omegas).cast<float>();
    // Below float32 (its rounding declaration) the landmarks and samples are stored, as LARA's code keeps them in the
    // model's dtype; the logits formed from them accumulate in float32 and stay there (one fused pass), and the
    // sample weights are stored for their product with f(ω_c), as P is in FlashAttention-2.
    const Precision stored = ctx.precision;
    round_in_place(factors, stored);
    const MatrixF omegas_root = factors.bottomRows(c_count);
    const MatrixF factors_t = factors.transpose();  // p × 2C, for the tile products (exact/tile_product.h)

    MatrixF f;  // C × pv: f(ω_c)
    VectorD log_key_sum;
    // −s‖k_j‖²/2, from the float32 keys' norms summed in double.
    const RowVectorF key_bias = (-0.5 * view.scale * key_squared_norms).transpose().cast<float>();
    key_chunked_attention_f32(omegas_root, view.kf, view.vf, 1.0f, &key_bias, f, &log_key_sum, ctx.pool);
    if (below_float32(stored)) {
      // f(ω_c) as exact attention of [ω̃_c, 1] over the keys [k_j, −s‖k_j‖²/2] (the bias stored as a column of the
      // keys) at FlashAttention-2's points; log Σ_j ξ(k_j, ω_c) stays the float32 pass's, as FlashAttention-2 keeps
      // its log-sum-exp in float32.
      MatrixF omega_aug(c_count, p + 1), key_aug(view.keys(), p + 1);
      omega_aug << omegas_root, RowVectorF::Ones(c_count).transpose();
      key_aug << view.kf, key_bias.transpose();
      exact_attention_rounded(omega_aug, key_aug, view.vf, 1.0f, stored, f, ctx.pool, QueryGeometry{});
    }

    out.resize(n, pv);
    const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
    const bool uses_r_prime = params_.weighting != LaraWeighting::kBalance;  // balance α = BH_c(ω_c) needs no r′
    // Where r′'s logits wait between the passes: out's rows, or a buffer when they do not fit there.
    MatrixF r_logits_buffer;
    float* r_logits = out.data();
    int64_t r_logits_ld = pv;
    if (uses_r_prime && c_count > pv) {
      r_logits_buffer.resize(n, c_count);
      r_logits = r_logits_buffer.data();
      r_logits_ld = c_count;
    }
    // What the next block of either pass reads: its queries and r′'s logits (common/prefetch.h).
    const auto next_block = [&](int64_t block) {
      const int64_t next = (block + 1) * kRowBlock, rows = std::min(kRowBlock, n - next);
      NextBlock ahead(n * (p + (uses_r_prime ? c_count : 0)) * static_cast<int64_t>(sizeof(float)));
      if (rows > 0) ahead.rows(view.qf.row(next).data(), rows, p);
      if (rows > 0 && uses_r_prime) ahead.rows(r_logits + next * r_logits_ld, rows, r_logits_ld);
      return ahead;
    };
    RowVectorF query_shift = RowVectorF::Zero(c_count);  // log Σ_n exp(q̃_n·q̄̃_c), r′'s column normalisers
    if (uses_r_prime) {
      MatrixF block_max(blocks, c_count), block_sum(blocks, c_count);
      for_each_index(ctx.pool, blocks, [&](int64_t block) {
        const int64_t i0 = block * kRowBlock, rows = std::min(kRowBlock, n - i0);
        const NextBlock ahead = next_block(block);
        thread_local MatrixF logits;  // Eigen-allocated, so exp splits rows alike on every thread
        logits.resize(rows, c_count);
        tile_product_assign(view.qf.row(i0).data(), p, rows, p, factors_t.data(), 2 * c_count, c_count, logits.data(),
                            c_count);
        Eigen::Map<MatrixF, 0, Eigen::OuterStride<>>(r_logits + i0 * r_logits_ld, rows, c_count,
                                                     Eigen::OuterStride<>(r_logits_ld)) = logits;
        auto max = block_max.row(block), sum = block_sum.row(block);
        max = logits.row(0);  // row by row: the rows are contiguous, the columns are not
        for (int64_t i = 1; i < rows; ++i) max = max.cwiseMax(logits.row(i));
        sum.setZero();
        for (int64_t i = 0; i < rows; ++i) {
          ahead.share(i, rows);
          sum.array() += (logits.row(i) - max).array().exp();
        }
      });
      for (int64_t c = 0; c < c_count; ++c) {  // the blocks combined in block order, in float64
        const double max = block_max.col(c).maxCoeff();
        double sum = 0;
        for (int64_t b = 0; b < blocks; ++b) sum += std::exp(block_max(b, c) - max) * block_sum(b, c);
        query_shift(c) = static_cast<float>(max + std::log(sum));
      }
    }

    // log w_nc = log α_nc + log N(ω_c; 0, I) + log ξ(q_n, ω_c) + log Σ_j ξ(k_j, ω_c) − log q_c(ω_c). The
    // terms constant in c (−‖q̃_n‖²/2 of ξ, and the largest per-sample term) cancel in the softmax over c and
    // are left out, which keeps the float32 logits small.
    RowVectorD per_sample(c_count);
    for (int64_t c = 0; c < c_count; ++c)
      per_sample(c) = -0.5 * omegas.row(c).squaredNorm() + log_norm + log_key_sum(c) - log_q(c, c);
    const RowVectorF per_sample_shifted = (per_sample.array() - per_sample.maxCoeff()).matrix().cast<float>();

    const MatrixD balance = lara_balance(log_q);  // C × C exps once, not per block (10% of a call at n = 1024)
    for_each_index(ctx.pool, blocks, [&](int64_t block) {
      const int64_t i0 = block * kRowBlock, rows = std::min(kRowBlock, n - i0);
      thread_local MatrixF logits, weights;  // rows × 2C: r′'s logits (from pass 1), then ξ's
      logits.resize(rows, 2 * c_count);
      if (uses_r_prime)
        logits.leftCols(c_count) = Eigen::Map<const MatrixF, 0, Eigen::OuterStride<>>(
            r_logits + i0 * r_logits_ld, rows, c_count, Eigen::OuterStride<>(r_logits_ld));
      tile_product_assign(view.qf.row(i0).data(), p, rows, p, factors_t.data() + c_count, 2 * c_count, c_count,
                          logits.data() + c_count, 2 * c_count);
      sample_weights(logits, c_count, query_shift, log_q, balance, per_sample_shifted, next_block(block), weights);
      round_in_place(weights, stored);
      tile_product_assign(weights.data(), c_count, rows, c_count, f.data(), pv, pv, out.row(i0).data(), pv);
    });
  }

  // Â_nj = Σ_c w_nc·P_cj with P_cj = softmax_j(ω_c·k̃_j − ‖k̃_j‖²/2), the attention row of sample c that f(ω_c)
  // averages v with (f(ω_c) = Σ_j P_cj·v_j), so out_n = Σ_j Â_nj·v_j. Rows sum to one (w and P do) and entries
  // are positive. Setup as estimate() plus O(C·n·p) for P; O(rows·C·keys) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "lara: attention weights under the causal mask are not stated yet");
    Draws draws = draw(view, ctx);
    MatrixD rows_of_samples = draws.omegas * draws.k.transpose();  // C × keys
    rows_of_samples.rowwise() -= 0.5 * draws.k.rowwise().squaredNorm().transpose();
    softmax_rows(rows_of_samples);
    return [weights = std::move(draws.weights), rows_of_samples = std::move(rows_of_samples)](
               int64_t r0, int64_t rows) { return MatrixD(weights.middleRows(r0, rows) * rows_of_samples); };
  }

  // Beyond the default's few n × (p + pv) float64 temporaries: r′'s logits when they do not fit in the
  // output's rows (n × C floats, estimate() above), and the attn and mixture proposals' C × n float64
  // mixture weights with their exps (the mixture's densities form two more C × n products).
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double c = static_cast<double>(std::min(params_.proposals, n)), rows = static_cast<double>(n);
    double bytes = Estimator::memory_bytes(n, p, pv);
    if (params_.weighting != LaraWeighting::kBalance && c > pv) bytes += 4.0 * rows * c;
    if (params_.proposal == LaraProposal::kAttn) bytes += 2.0 * 8.0 * c * rows;
    if (params_.proposal == LaraProposal::kMixture) bytes += 4.0 * 8.0 * c * rows;
    return bytes;
  }

  // The products of estimate(): f(ω_c) over the keys (C·n·(p + pv)), r′'s and ξ's logits (2·n·C·p) and the
  // output (n·C·pv), two flops each.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * n * params_.proposals * (3.0 * p + 2.0 * pv);
  }

 private:
  // A block's sample weights w_nc = softmax_c(log α̃_nc + x_nc) with x_nc = log ξ(q_n, ω_c) + per_sample_c and
  // α̃ = max(α, 1e-8) (the reference code's clamp), from the block's rows × 2C logits (r′'s, then ξ's):
  //   w_nc = α̃_nc·e^{x_nc − max_c x_nc} / Σ_c′ α̃_nc′·e^{x_nc′ − max_c x_nc},
  // the same softmax without the log of α: a third of the block's exp and log evaluations, which took half as
  // long as its two products (2.1 ms of a 12.6 ms call at n = 16384; 1.08–1.11× faster calls without). The
  // sum is at least 1e-8, its term at the largest x. The balance and decoupled α need row n alone and are formed row by
  // row while it is in L1 (r′_nc = e^{logit_nc − shift_c}; decoupled α = β·r′_nc − β·mean_c′ r′_nc′ + BH_c(ω_c),
  // balance α = BH_c(ω_c), which needs no r′); the coupled one mixes the row through the C × C balance matrix and is
  // formed for the whole block by lara_alpha_at_samples. `ahead` is the next block's input, prefetched a share
  // per row.
  void sample_weights(const MatrixF& logits, int64_t c_count, const RowVectorF& query_shift, const MatrixD& log_q,
                      const MatrixD& balance, const RowVectorF& per_sample, const NextBlock& ahead, MatrixF& w) const {
    using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
    if (params_.weighting == LaraWeighting::kCoupled) {
      thread_local MatrixF r_prime;  // scratch of the running thread, kept between blocks
      r_prime = logits.leftCols(c_count);
      r_prime.rowwise() -= query_shift;
      r_prime = r_prime.array().exp();  // in place: exp of a rowwise() expression did not vectorise
      w = lara_alpha_at_samples(params_.weighting, params_.beta, log_q, balance, r_prime);
    } else {
      w.resize(logits.rows(), c_count);
    }
    const RowVectorF own_balance = balance.diagonal().transpose().cast<float>();  // BH_c(ω_c)
    const ConstRow shift(query_shift.data(), c_count), bh(own_balance.data(), c_count),
        constant(per_sample.data(), c_count);
    const float beta = static_cast<float>(params_.beta);
    Eigen::ArrayXf x(c_count);
    for (int64_t i = 0; i < logits.rows(); ++i) {
      ahead.share(i, logits.rows());
      const ConstRow r_logits(logits.row(i).data(), c_count), xi_logits(logits.row(i).data() + c_count, c_count);
      Eigen::Map<Eigen::ArrayXf> row(w.row(i).data(), c_count);  // α, then w
      if (params_.weighting == LaraWeighting::kDecoupled) {
        row = (r_logits - shift).exp();  // r′
        const float mean = row.sum() / static_cast<float>(c_count);
        row = beta * row - beta * mean + bh;
      } else if (params_.weighting == LaraWeighting::kBalance) {
        row = bh;
      }
      x = xi_logits + constant;
      row = row.max(1e-8f) * (x - x.maxCoeff()).exp();
      row /= row.sum();
    }
  }

  struct Draws {
    MatrixD weights;  ///< n × C: w_nc, rows sum to one
    MatrixD values;   ///< C × pv: f(ω_c)
    MatrixD omegas;   ///< C × p: ω_c (scaled space)
    MatrixD k;        ///< keys × p: k̃
  };

  // Everything but the final n × C × pv product, shared by estimate() and weights().
  Draws draw(const HeadView& view, const EstimateContext& ctx) const {
    const int64_t n = view.n(), p = view.p();
    const double root_scale = std::sqrt(view.scale);
    const MatrixD q = root_scale * view.q, k = root_scale * view.k;  // scaled space
    const auto segments = contiguous_segments(n, params_.proposals);
    const int64_t c_count = static_cast<int64_t>(segments.size());
    const MatrixD q_bar = segment_means(q, segments), k_bar = segment_means(k, segments);
    // The noise's std in the scaled space; the densities below always use std 1 (see the header).
    const double draw_sigma = params_.raw_noise ? root_scale : 1.0;

    const auto [log_pi, mu, omegas, log_q] = lara_proposals(params_, q_bar, k_bar, k, n, p, draw_sigma, ctx.key);

    // r′_nc = softmax over queries n of q̃_n·q̄_c: formed as C × n so the softmax runs along rows
    // (column passes over the row-major n × C matrix took half of the whole estimator's time).
    MatrixD r_prime_t = q_bar * q.transpose();
    softmax_rows(r_prime_t);
    const MatrixD r_prime = r_prime_t.transpose();

    // f(ω_c) and log Σ_j ξ(k_j, ω_c); log ξ(q_n, ω_c).
    VectorD log_key_sum;
    const MatrixD f = key_value_average(omegas, k, view.v, &log_key_sum);  // C × pv
    const MatrixD log_xi_q = log_features(q, omegas);                      // n × C

    // log w_nc = log α_nc + log N(ω_c; 0, I) + log ξ(q_n, ω_c) + log Σ_j ξ(k_j, ω_c) − log q_c(ω_c),
    // as whole-matrix operations (column-wise passes over a row-major n × C matrix were 5× slower).
    const MatrixD alpha = lara_alpha_at_samples(params_.weighting, params_.beta, log_q, r_prime);
    RowVectorD per_sample(c_count);
    for (int64_t c = 0; c < c_count; ++c)
      per_sample(c) =
          -0.5 * omegas.row(c).squaredNorm() - 0.5 * p * std::log(2 * std::numbers::pi) + log_key_sum(c) - log_q(c, c);
    MatrixD log_w = alpha.array().max(1e-8).log() + log_xi_q.array();
    log_w.rowwise() += per_sample;
    softmax_rows(log_w);
    return {std::move(log_w), f, std::move(omegas), k};
  }

  LaraParams params_;

  static constexpr int64_t kRowBlock = 256;  ///< query rows per block: 256 × 2C floats stay in L2
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<LaraParams>{
    .name = "lara",
    .family = "random-features",
    .summary = "LARA: C proposals from segment landmarks, one sample each, multiple importance sampling (O(n C p))",
    .page = "estimators/random-features.md",
    .params =
        ParamSet<LaraParams>()
            .integer("C", &LaraParams::proposals, 1, 1 << 16,
                     "proposals (segments); C = 1 is the single-proposal ablation")
            .choice("proposal", &LaraParams::proposal,
                    {{"segment", LaraProposal::kSegment},
                     {"attn", LaraProposal::kAttn},
                     {"mixed", LaraProposal::kMixed},
                     {"mixture", LaraProposal::kMixture}},
                    "proposal means (Eqs. 32-35): q_c+k_c, q_c+attn(q_c), q_c+mixed keys, or the Gaussian mixture")
            .choice("weights", &LaraParams::weighting,
                    {{"balance", LaraWeighting::kBalance},
                     {"coupled", LaraWeighting::kCoupled},
                     {"decoupled", LaraWeighting::kDecoupled}},
                    "MIS weighting (Eqs. 36-38)")
            .real("beta", &LaraParams::beta, 0, 100, "query-specific weighting strength (paper: 2 slightly better)")
            .choice("mode", &LaraParams::sample, {{"sample", true}, {"mean", false}},
                    "sample: omega_c = mu_c + eps; mean: omega_c = mu_c (reference evaluation mode, deterministic)")
            .choice("noise", &LaraParams::raw_noise, {{"scaled", false}, {"raw", true}},
                    "scaled: eps ~ N(0, I) in the scaled space; raw: drawn with std sqrt(s), densities still N(mu, I) "
                    "(reference code)"),
    .samples_knob = "C",
    .capabilities = {.random = true,
                     .weights = kFullOnly,
                     .rounding = "the landmarks and the samples ω_c stored in the precision; f(ω_c), the samples' "
                                 "attention over the keys [k, −s‖k‖²/2], at FlashAttention-2's points (softmax's), its "
                                 "log-sum-exp float32; the logits of r′ and ξ accumulated float32 and the sample "
                                 "weights' softmax float32 (one fused pass), the weights w stored in the precision for "
                                 "their product with f, that product accumulated float32; output rounded"},
    .narrow = [](const LaraParams& params, Capabilities& can) { can.random = params.sample; },
    .ablations = {"lara(weights=coupled,beta=2)", "lara(C=1)"},  // the paper's best beta; its single-proposal ablation
    .make = [](const LaraParams& params) { return std::make_unique<Lara>(params); },
});

}  // namespace
}  // namespace attnprobe
