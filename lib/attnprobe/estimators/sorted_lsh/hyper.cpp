// hyper(m, b, r, order, mask) — HyperAttention (Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh,
// ICLR 2024; reference insuhan/hyper-attn), non-causal forward. Target: softmax.
//  1. sortLSH blocks (sort_lsh.h): exact softmax over the heavy set H_i (the keys in q_i's block);
//  2. t_1..t_m uniform on [0, n) with replacement, shared by all queries (Purpose kColumnSample);
//     R_i = {u : β_K(t_u) ≠ β_Q(i)} (mask=1; mask=0 keeps every u);
//  3. merged by log-sum-exp: L_i = logaddexp(L^B_i, L^R_i + log(n/m)), out_i = c·O^B + (1 − c)·O^R,
//     c = exp(L^B − L_i) — the same as (N̂^B + N̂^R)/(D̂^B + D̂^R), which is how it is evaluated (one
//     shift per row serving both parts).
// Given the hash, D̂_i = e^{L_i} and N̂_i = e^{L_i}·out_i are unbiased for D_i, N_i (uniform
// Horvitz–Thompson on the off-block keys); out_i is a ratio, biased O(1/m). Reference differences:
// the in-block mask exists only in its fp16/bf16 Triton path — its fp32 `exact_attention` ignores it
// and the flash-attn path never builds it, so in-block keys count twice (mask=0 reproduces that); below
// 4096 tokens it silently returns exact attention (never here: every shipped dump would be exact); it
// pads to a multiple of b with zero keys (never here). No causal form in this version.
// Cost O(n·r·p + n log n + n·(b + m)·(p + pv)), memory O(b·(b + m)) per block; float32 except the hash.
#include "attnprobe/estimators/sorted_lsh/hyper.h"

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {

HyperParams HyperParams::from_spec(const Spec& spec) {
  HyperParams params;
  params.samples = spec.get_int("m");
  params.block = spec.get_int("b");
  params.bits = static_cast<int>(spec.get_int("r"));
  params.order = spec.get_choice("order") == "gray" ? BucketOrder::kGray : BucketOrder::kCode;
  params.mask = spec.get_int("mask") == 1;
  return params;
}

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
                           const SortLshBlocks* given_blocks, ThreadPool* pool) {
  const SortLshBlocks blocks =
      given_blocks ? *given_blocks
                   : sort_lsh_blocks(view.q, view.k, params.bits, params.block, params.order, key, pool);
  std::vector<int64_t> samples;
  std::vector<double> weights;
  hyper_samples(params, view.n(), key, samples, weights);
  MatrixT<S> out;
  block_plus_samples<S>(slice_data<S>(view), view.scale, blocks, samples, weights, params.mask, out, log_denominator,
                        pool);
  return out;
}

template MatrixT<float> hyper_attention<float>(const HyperParams&, const HeadView&, RandomKey, VectorD*,
                                               const SortLshBlocks*, ThreadPool*);
template MatrixT<double> hyper_attention<double>(const HyperParams&, const HeadView&, RandomKey, VectorD*,
                                                 const SortLshBlocks*, ThreadPool*);

std::vector<ParamDef> sorted_lsh_params(std::string m_default, std::string m_help, std::vector<ParamDef> own) {
  std::vector<ParamDef> params = {{"m", ParamKind::kInt, std::move(m_default), 0, 1 << 24, {}, std::move(m_help)},
                                  {"b", ParamKind::kInt, "64", 1, 1 << 24, {}, "block size (b >= n: exact)"},
                                  {"r", ParamKind::kInt, "7", 0, 30, {}, "hash bits (0: contiguous blocks)"},
                                  {"order",
                                   ParamKind::kChoice,
                                   "gray",
                                   0,
                                   0,
                                   {"gray", "code"},
                                   "bucket order: gray (Gray rank) or code (c xor c>>1, as the reference repos)"}};
  params.insert(params.end(), own.begin(), own.end());
  return params;
}

bool sorted_lsh_random(const Spec& spec) { return spec.get_int("m") > 0 || spec.get_int("r") > 0; }

namespace {

class Hyper final : public Estimator {
 public:
  explicit Hyper(HyperParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    out = hyper_attention<float>(params_, view, ctx.key, nullptr, nullptr, ctx.pool);
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

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "hyper",
    .family = "sorted-lsh",
    .summary = "HyperAttention: exact softmax on sortLSH blocks + uniform samples of the other keys, merged by "
               "log-sum-exp (O(n (b + m) p))",
    .params = sorted_lsh_params(
        "64", "uniform residual samples (with replacement), 0: none",
        {{"mask", ParamKind::kInt, "1", 0, 1, {}, "1: drop in-block samples; 0: count them again (reference)"}}),
    .samples_knob = "m",
    .random = true,
    .random_for = sorted_lsh_random,
    .target = nullptr,
    .weights = true,
    .ablations = {"hyper(mask=0)", "hyper(m=0)"},  // the reference's double count; heavy blocks only
    .make = [](const Spec& spec) { return std::make_unique<Hyper>(HyperParams::from_spec(spec)); },
});

}  // namespace
}  // namespace attnprobe
