#include "attnprobe/estimators/sorted_lsh/hyper/hyper.h"

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sorted_lsh/sorted_lsh_keys.h"

namespace attnprobe {

namespace {

// The residual samples t_u (uniform on [0, n), with replacement) and their weights c_u = n/m.
void hyper_samples(const HyperParams& params, int64_t n, RandomKey key, std::vector<int64_t>& samples,
                   std::vector<double>& weights) {
  samples.clear();
  if (params.samples > 0)
    samples =
        sample_with_replacement(std::vector<double>(n, 1.0), params.samples, RandomStream(key, Purpose::kColumnSample));
  weights.assign(samples.size(), static_cast<double>(n) / static_cast<double>(params.samples));
}

}  // namespace

template <typename S>
MatrixT<S> hyper_attention(const HyperParams& params, const HeadView& view, RandomKey key, VectorD* log_denominator,
                           const SortLshBlocks* given_blocks, ThreadPool* pool, Precision stored) {
  const SortLshBlocks blocks =
      given_blocks ? *given_blocks
                   : sort_lsh_blocks(view.q, view.k, params.bits, params.block, params.order, key, pool);
  std::vector<int64_t> samples;
  std::vector<double> weights;
  hyper_samples(params, view.n(), key, samples, weights);
  MatrixT<S> out;
  block_plus_samples<S>(slice_data<S>(view), view.scale, blocks, samples, weights, params.mask, out, log_denominator,
                        pool, stored);
  return out;
}

template MatrixT<float> hyper_attention<float>(const HyperParams&, const HeadView&, RandomKey, VectorD*,
                                               const SortLshBlocks*, ThreadPool*, Precision);
template MatrixT<double> hyper_attention<double>(const HyperParams&, const HeadView&, RandomKey, VectorD*,
                                                 const SortLshBlocks*, ThreadPool*, Precision);

namespace {

class Hyper final : public Estimator {
 public:
  explicit Hyper(HyperParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    out = hyper_attention<float>(params_, view, ctx.key, nullptr, nullptr, ctx.pool, ctx.precision);
  }

  // Â_ij = c_ij·e_ij / Σ_j′ c_ij′·e_ij′ with c_ij = 1 on q_i's block plus n/m per kept sample of key j
  // (sort_lsh.h, block_plus_samples_rows): the same hash and samples as estimate(). O(rows·n·p) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "hyper has no causal form in this version");
    SortLshBlocks blocks = sort_lsh_blocks(view.q, view.k, params_.bits, params_.block, params_.order, ctx.key);
    std::vector<int64_t> samples;
    std::vector<double> sample_weights;
    hyper_samples(params_, view.n(), ctx.key, samples, sample_weights);
    return [&view, blocks = std::move(blocks), samples = std::move(samples), sample_weights = std::move(sample_weights),
            mask = params_.mask](int64_t r0, int64_t rows) {
      return block_plus_samples_rows(view.q, view.k, view.scale, blocks, samples, sample_weights, mask, r0, rows);
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * n * static_cast<double>(std::min(params_.block, n) + params_.samples) * (p + pv);
  }

 private:
  HyperParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<HyperParams>{
    .name = "hyper",
    .family = "sorted-lsh",
    .summary = "HyperAttention: exact softmax on sortLSH blocks + uniform samples of the other keys, merged by "
               "log-sum-exp (O(n (b + m) p))",
    .page = "estimators/beyond.md",
    .params =
        sorted_lsh_keys<HyperParams>("uniform residual samples (with replacement), 0: none")
            .integer("mask", &HyperParams::mask, 0, 1, "1: drop in-block samples; 0: count them again (reference)"),
    .samples_knob = "m",
    .capabilities = {.random = true, .weights = kFullOnly, .rounding = kSortedLshRounding},
    .narrow = narrow_sorted_lsh<HyperParams>,
    .ablations = {"hyper(mask=0)", "hyper(m=0)"},  // the reference's double count; heavy blocks only
    .make = [](const HyperParams& params) { return std::make_unique<Hyper>(params); },
});

}  // namespace
}  // namespace attnprobe
