#include "attnprobe/estimators/sorted_lsh/kdeformer/kdeformer.h"

#include <fmt/format.h>
#include <Eigen/Eigenvalues>

#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sorted_lsh/sorted_lsh_keys.h"

namespace attnprobe {

std::vector<double> kdeformer_weights(KdeProbs probs, const HeadView& view, const SortLshBlocks& blocks,
                                      ThreadPool* pool) {
  const int64_t n = view.n(), pv = view.pv();
  std::vector<double> weights(n, 1.0);
  if (probs == KdeProbs::kUniform) return weights;
  // ‖ṽ_j‖ and ṼᵀṼ = [VᵀV, Vᵀ1; 1ᵀV, n] from V itself: an n × (pv + 1) copy of Ṽ was 33 MiB at
  // n = 65536 (page faults), and VᵀV as a symmetric rank update is half a product (the eigensolver
  // reads the lower triangle only). The rows go in sum_row_groups' fixed groups on the pool.
  if (probs == KdeProbs::kVnorm) {
    VectorD v_norms(n);
    // The norms with the Gram matrix, on the pool while each group's rows are in the cache; they were a serial
    // pass, and with the eigenvectors the eigensolver no longer computes, the serial part of a two-thread call.
    // n = 4096, three alternating rounds: two threads 1.78–1.89 → 1.68–1.86 ms, t1/t2 1.76–1.80 → 1.81–1.87.
    MatrixD gram =
        sum_row_groups<MatrixD>(pool, n, MatrixD::Zero(pv + 1, pv + 1), [&](int64_t begin, int64_t end, MatrixD& part) {
          part.topLeftCorner(pv, pv).selfadjointView<Eigen::Lower>().rankUpdate(
              view.v.middleRows(begin, end - begin).transpose());
          for (int64_t j = begin; j < end; ++j) {
            part.row(pv).head(pv) += view.v.row(j);
            v_norms(j) = std::sqrt(view.v.row(j).squaredNorm() + 1.0);
          }
        });
    gram(pv, pv) = static_cast<double>(n);
    // The largest eigenvalue only: no eigenvectors to accumulate (the same values).
    const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(gram, Eigen::EigenvaluesOnly);
    const double sigma2 = eigen.eigenvalues().maxCoeff();  // ≥ n > 0: the ones column alone gives n
    for (int64_t j = 0; j < n; ++j) weights[j] = v_norms(j) / sigma2 + 1.0 / static_cast<double>(n);
    return weights;
  }
  const VectorD v_norms = (view.v.rowwise().squaredNorm().array() + 1.0).sqrt();
  // colnorm: column j's squared norm over the queries not in j's block, Σ_{i: β_Q(i) ≠ β_K(j)} B_ij²,
  // B_ij = exp(s·q_i·k_j − lse_i); float32 logits in row blocks, float64 exponentials and sums.
  std::vector<double> column(n, 0.0);
  const int64_t rows_per_block = 256;
  const float s = static_cast<float>(view.scale);
  for (int64_t r0 = 0; r0 < n; r0 += rows_per_block) {
    const int64_t rows = std::min(rows_per_block, n - r0);
    const MatrixF logits = s * (view.qf.middleRows(r0, rows) * view.kf.transpose());
    for (int64_t r = 0; r < rows; ++r) {
      const Eigen::ArrayXd row = logits.row(r).cast<double>().transpose().array();
      const double max = row.maxCoeff();
      const double lse = max + std::log((row - max).exp().sum());
      const int64_t own = blocks.query_block[r0 + r];
      for (int64_t j = 0; j < n; ++j)
        if (blocks.key_block[j] != own) column[j] += std::exp(2 * (row(j) - lse));
    }
  }
  for (int64_t j = 0; j < n; ++j) weights[j] = std::sqrt(column[j]) * v_norms(j);
  return weights;
}

namespace {

// The residual samples t_u ∝ w (with replacement) and their weights c_u = 1/(m·P_{t_u}); `weights` receives w.
void kdeformer_samples(const KdeformerParams& params, const HeadView& view, const SortLshBlocks& blocks, RandomKey key,
                       std::vector<double>& weights, std::vector<int64_t>& samples, std::vector<double>& sample_weights,
                       ThreadPool* pool = nullptr) {
  weights = kdeformer_weights(params.probs, view, blocks, pool);
  double total = 0;
  for (double w : weights) total += w;
  samples.clear();
  sample_weights.clear();
  // total = 0 only under colnorm when every column is masked for every query (b ≥ n): no residual.
  if (params.samples > 0 && total > 0) {
    samples = sample_with_replacement(weights, params.samples, RandomStream(key, Purpose::kColumnSample));
    for (int64_t t : samples) sample_weights.push_back(total / (static_cast<double>(params.samples) * weights[t]));
  }
}

}  // namespace

template <typename S>
MatrixT<S> kdeformer_attention(const KdeformerParams& params, const HeadView& view, RandomKey key,
                               VectorD* log_denominator, std::vector<double>* weights_out,
                               const SortLshBlocks* given_blocks, ThreadPool* pool, Precision stored) {
  const SortLshBlocks blocks =
      given_blocks ? *given_blocks
                   : sort_lsh_blocks(view.q, view.k, params.bits, params.block, params.order, key, pool);
  std::vector<double> weights, sample_weights;
  std::vector<int64_t> samples;
  kdeformer_samples(params, view, blocks, key, weights, samples, sample_weights, pool);
  if (weights_out) *weights_out = weights;
  MatrixT<S> out;
  block_plus_samples<S>(slice_data<S>(view), view.scale, blocks, samples, sample_weights, true, out, log_denominator,
                        pool, stored);
  return out;
}

template MatrixT<float> kdeformer_attention<float>(const KdeformerParams&, const HeadView&, RandomKey, VectorD*,
                                                   std::vector<double>*, const SortLshBlocks*, ThreadPool*, Precision);
template MatrixT<double> kdeformer_attention<double>(const KdeformerParams&, const HeadView&, RandomKey, VectorD*,
                                                     std::vector<double>*, const SortLshBlocks*, ThreadPool*,
                                                     Precision);

namespace {

class Kdeformer final : public Estimator {
 public:
  explicit Kdeformer(KdeformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    out = kdeformer_attention<float>(params_, view, ctx.key, nullptr, nullptr, nullptr, ctx.pool, ctx.precision);
  }

  // Â_ij = c_ij·e_ij / Σ_j′ c_ij′·e_ij′ with c_ij = 1 on q_i's block plus 1/(m·P_j) per off-block sample of
  // key j (sort_lsh.h, block_plus_samples_rows): the same hash and samples as estimate(). O(rows·n·p) per
  // block (plus kdeformer_weights' O(n²·p) once for probs=colnorm).
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "kdeformer has no causal form");
    SortLshBlocks blocks = sort_lsh_blocks(view.q, view.k, params_.bits, params_.block, params_.order, ctx.key);
    std::vector<double> probabilities, sample_weights;
    std::vector<int64_t> samples;
    kdeformer_samples(params_, view, blocks, ctx.key, probabilities, samples, sample_weights);
    return [&view, blocks = std::move(blocks), samples = std::move(samples),
            sample_weights = std::move(sample_weights)](int64_t r0, int64_t rows) {
      return block_plus_samples_rows(view.q, view.k, view.scale, blocks, samples, sample_weights, true, r0, rows);
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * n * static_cast<double>(std::min(params_.block, n) + params_.samples) * (p + pv);
  }

 private:
  KdeformerParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<KdeformerParams>{
    .name = "kdeformer",
    .family = "sorted-lsh",
    .summary = "KDEformer as coded: exact sortLSH blocks + importance-weighted samples of the other keys "
               "(O(n (b + m) p))",
    .page = "estimators/beyond.md",
    .params =
        sorted_lsh_keys<KdeformerParams>("residual samples (with replacement), 0: none")
            .choice("probs", &KdeformerParams::probs,
                    {{"vnorm", KdeProbs::kVnorm}, {"uniform", KdeProbs::kUniform}, {"colnorm", KdeProbs::kColnorm}},
                    "sampling: vnorm (the code), uniform (= hyper), colnorm (O(n^2) oracle: masked column norms)"),
    .samples_knob = "m",
    .capabilities = {.random = true, .weights = kFullOnly, .rounding = kSortedLshRounding},
    .narrow = narrow_sorted_lsh<KdeformerParams>,
    .make = [](const KdeformerParams& params) { return std::make_unique<Kdeformer>(params); },
});

}  // namespace
}  // namespace attnprobe
