#include "attnprobe/estimators/sketching/informer/informer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {

std::vector<int64_t> informer_active_rows(const HeadView& view, const RandomKey& key, const InformerParams& params,
                                          ThreadPool* pool, Precision stored) {
  const int64_t n = view.n();
  const int64_t u = params.budget(n);
  const float scale = static_cast<float>(view.scale);

  const RandomStream stream(key, Purpose::kRowSample);
  std::vector<std::pair<float, int64_t>> sparsity(n);
  // The sampled keys are random rows of K: past n ≈ 32768 K leaves the cache, and each one is a trip to
  // memory. A block's draws are made first (the same numbers as stream.index(n, i, s)), and the rows
  // kAhead samples ahead are prefetched across the block's queries, so the loads overlap instead of
  // waiting one after another (314 → 123 ms at n = 65536; prefetching within each query only, the first
  // kAhead of its ~70 rows were waited for: 93 → 81 ms with K on huge pages, make_head_view; sorting a
  // block's samples by key block to read K once per block was slower).
  constexpr int64_t kQueryBlock = 64, kAhead = 16;
  const int64_t row_bytes = view.kf.cols() * static_cast<int64_t>(sizeof(float));
  const auto prefetch_row = [&](int64_t key) {
    const char* row = reinterpret_cast<const char*>(view.kf.row(key).data());
    for (int64_t byte = 0; byte < row_bytes; byte += 64) __builtin_prefetch(row + byte);
  };
  for_each_index(pool, (n + kQueryBlock - 1) / kQueryBlock, [&](int64_t b) {
    thread_local std::vector<double> draws;
    thread_local std::vector<int64_t> sampled;  // the block's queries' keys, u per query
    const int64_t first = b * kQueryBlock, queries = std::min(n, first + kQueryBlock) - first;
    draws.resize(u);
    sampled.resize(queries * u);
    for (int64_t r = 0; r < queries; ++r) {
      stream.uniforms(static_cast<uint32_t>(first + r), 0, 0, draws.data(), u);
      for (int64_t s = 0; s < u; ++s)  // as RandomStream::index: u ∈ (0, 1], so u·n = n is clamped
        sampled[r * u + s] = std::min<int64_t>(static_cast<uint32_t>(draws[s] * static_cast<uint32_t>(n)), n - 1);
    }
    const int64_t total = queries * u;
    for (int64_t t = 0; t < std::min(kAhead, total); ++t) prefetch_row(sampled[t]);
    for (int64_t r = 0; r < queries; ++r) {
      const int64_t i = first + r;
      float max = -INFINITY;
      double sum = 0;
      for (int64_t t = r * u; t < (r + 1) * u; ++t) {
        if (t + kAhead < total) prefetch_row(sampled[t + kAhead]);
        const float logit = round_to(scale * view.qf.row(i).dot(view.kf.row(sampled[t])), stored);
        max = std::max(max, logit);
        sum += logit;
      }
      sparsity[i] = {round_to(max - static_cast<float>(sum / n), stored), i};
    }
  });
  // The u most "active" queries; ties by index, so the choice is deterministic.
  std::partial_sort(sparsity.begin(), sparsity.begin() + u, sparsity.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::vector<int64_t> active(u);
  for (int64_t r = 0; r < u; ++r) active[r] = sparsity[r].second;
  return active;
}

namespace {

class Informer final : public Estimator {
 public:
  explicit Informer(InformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const std::vector<int64_t> active = informer_active_rows(view, ctx.key, params_, ctx.pool, ctx.precision);
    mean_rows(view.vf, out, ctx.pool);  // mean(V) in every row, as vmean's estimate
    // A few dozen exact rows over all keys: key chunks on the pool; below float32 at softmax's rounding points.
    MatrixF exact_rows;
    if (below_float32(ctx.precision))
      exact_attention_rounded(view.qf(active, Eigen::all), view.kf, view.vf, static_cast<float>(view.scale),
                              ctx.precision, exact_rows, ctx.pool, QueryGeometry{});
    else
      key_chunked_attention_f32(view.qf(active, Eigen::all), view.kf, view.vf, static_cast<float>(view.scale), nullptr,
                                exact_rows, nullptr, ctx.pool);
    for (size_t r = 0; r < active.size(); ++r) out.row(active[r]) = exact_rows.row(r);
  }

  // Exact softmax rows for the active queries, uniform 1/n rows for the others.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    std::vector<char> is_active(view.n(), 0);
    for (int64_t i : informer_active_rows(view, ctx.key, params_, ctx.pool)) is_active[i] = 1;
    return [&view, is_active](int64_t r0, int64_t rows) {
      MatrixD w = MatrixD::Constant(rows, view.k.rows(), 1.0 / view.k.rows());
      for (int64_t i = 0; i < rows; ++i)
        if (is_active[r0 + i]) w.row(i) = attention_rows_f64(view.q, view.k, view.scale, r0 + i, 1);
      return w;
    };
  }

  // The sparsity pass (U sampled logits per query) and the u exact rows over all keys (logits and P·V);
  // mean(V) is a copy, not counted.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double budget = static_cast<double>(params_.budget(n));  // u = U
    return 2.0 * n * budget * p + 2.0 * budget * n * (p + pv);
  }

 private:
  InformerParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<InformerParams>{
    .name = "informer",
    .family = "sketching",
    .summary =
        "Informer ProbSparse: exact rows for the ~d queries with the largest sampled sparsity, mean(V) elsewhere",
    .page = "estimators/sketching.md",
    .params = ParamSet<InformerParams>().integer("d", &InformerParams::d, 1, 1 << 24,
                                                 "budget: u = ceil(d/ln n)*ceil(ln n) exact rows"),
    .samples_knob = "d",
    .capabilities = {.random = true,
                     .weights = kFullOnly,
                     .rounding = "inputs and output in the precision; the sampled logits and each query's sparsity "
                                 "stored in it, as the reference computes them in the model's dtype (sparsities that "
                                 "round alike tie: the earlier row is chosen); the chosen rows at FlashAttention-2's "
                                 "points (softmax's); mean(V) summed in float64 and stored once"},
    // Its exact rows run on the tf32x3 attention kernel: observed ≤ 1.2e-6 relative (H100, seed 12345).
    .devices = {{.device = Device::kCuda, .forms = kFullOnly, .tolerance = 1e-4}},
    .make = [](const InformerParams& params) { return std::make_unique<Informer>(params); },
});

}  // namespace
}  // namespace attnprobe
