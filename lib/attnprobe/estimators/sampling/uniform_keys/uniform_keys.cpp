#include "attnprobe/estimators/sampling/uniform_keys/uniform_keys.h"

#include <algorithm>
#include <cmath>

#include "attnprobe/common/rounding.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {

std::vector<int64_t> uniform_keys_sample(int64_t visible, int64_t budget, const RandomStream& stream, int64_t row,
                                         double* inclusion) {
  const double pi = std::min(1.0, static_cast<double>(budget) / static_cast<double>(visible));
  if (inclusion) *inclusion = pi;
  std::vector<int64_t> keys;
  if (pi >= 1.0) {  // every key (the gap law's log(1 − π) is −∞ there)
    keys.resize(visible);
    for (int64_t j = 0; j < visible; ++j) keys[j] = j;
    return keys;
  }
  keys.reserve(static_cast<size_t>(2.0 * budget + 16));
  const double log_miss = std::log1p(-pi);
  int64_t next = 0;
  for (uint32_t s = 0;; ++s) {
    // u ∈ (0, 1], so the gap is ≥ 0; a gap past the row ends it.
    const double gap = std::floor(std::log(stream.uniform(static_cast<uint32_t>(row), s)) / log_miss);
    if (gap >= static_cast<double>(visible - next)) break;
    next += static_cast<int64_t>(gap);
    keys.push_back(next++);
    if (next >= visible) break;
  }
  return keys;
}

namespace {

class UniformKeys final : public Estimator {
 public:
  explicit UniformKeys(UniformKeysParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), pv = view.pv();
    const RandomStream stream(ctx.key, Purpose::kColumnSample);
    const float scale = static_cast<float>(view.scale);
    out.setZero(n, pv);
    for_each_index(ctx.pool, (n + kRowBlock - 1) / kRowBlock, [&](int64_t block) {
      thread_local Eigen::VectorXf logits;
      for (int64_t i = block * kRowBlock; i < std::min(n, (block + 1) * kRowBlock); ++i) {
        const std::vector<int64_t> sample = visible_sample(view, i, params_.budget, stream);
        if (sample.empty()) continue;  // the zero row
        logits.resize(static_cast<int64_t>(sample.size()));
        for (size_t r = 0; r < sample.size(); ++r) logits(r) = scale * view.qf.row(i).dot(view.kf.row(sample[r]));
        logits = (logits.array() - logits.maxCoeff()).exp();
        const float total = logits.sum();  // FlashAttention-2's row sum: of the float32 P, before P is stored
        round_in_place(logits.data(), logits.size(), ctx.precision);
        auto row = out.row(i);
        for (size_t r = 0; r < sample.size(); ++r) row += logits(r) * view.vf.row(sample[r]);
        row /= total;
      }
    });
  }

  // Â_tj = e^{ℓ_j} / Σ_{S_t} e^{ℓ} on S_t (π_t cancels), 0 elsewhere, in float64 from the same samples.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    return [&view, budget = params_.budget, stream = RandomStream(ctx.key, Purpose::kColumnSample)](int64_t r0,
                                                                                                    int64_t rows) {
      MatrixD w = MatrixD::Zero(rows, view.k.rows());
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = r0 + i;
        const std::vector<int64_t> sample = visible_sample(view, t, budget, stream);
        if (sample.empty()) continue;
        double top = -INFINITY;
        for (const int64_t j : sample) top = std::max(top, view.scale * view.q.row(t).dot(view.k.row(j)));
        double total = 0;
        for (const int64_t j : sample) total += w(i, j) = std::exp(view.scale * view.q.row(t).dot(view.k.row(j)) - top);
        w.row(i) /= total;
      }
      return w;
    };
  }

  // The logits and the weighted sum over the ~min(b, n) kept keys of every row.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * n * static_cast<double>(std::min(params_.budget, n)) * (p + pv);
  }

 private:
  // Row i's sample among the keys it sees, drawn at its absolute position (so a row draws the same keys
  // whichever rows are evaluated with it).
  static std::vector<int64_t> visible_sample(const HeadView& view, int64_t i, int64_t budget,
                                             const RandomStream& stream) {
    const KeyRange seen = view.visible(i);
    std::vector<int64_t> sample = uniform_keys_sample(seen.size(), budget, stream, view.position(i));
    for (int64_t& j : sample) j += seen.begin;
    return sample;
  }

  UniformKeysParams params_;
  static constexpr int64_t kRowBlock = 64;  ///< rows per task on the pool
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<UniformKeysParams>{
    .name = "uniform_keys",
    .family = "sampling",
    .summary = "uniform key sampling: each row keeps each key with probability b/keys, Horvitz-Thompson "
               "weights (O(n b p))",
    .page = "estimators/sampling.md",
    .params = ParamSet<UniformKeysParams>().integer("b", &UniformKeysParams::budget, 1, 1 << 24,
                                                    "keys kept per row in expectation (b >= keys: exact)"),
    .samples_knob = "b",
    .capabilities = {.random = true,
                     .forms = kAllMasks,
                     .decode = kAllMasks,
                     .weights = kAllMasks,
                     .rounding =
                         "the sampled keys attended at FlashAttention-2's points: logits s·q·k, P = exp(S − max) "
                         "and its row sum float32, P stored in the precision for P·V, P·V float32, the output "
                         "rounded"},
    .make = [](const UniformKeysParams& params) { return std::make_unique<UniformKeys>(params); },
});

}  // namespace
}  // namespace attnprobe
