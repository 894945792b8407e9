// informer(d) — Informer's ProbSparse row selection as adapted in the Skeinformer code (Zhou et al.,
// AAAI 2021; docs/estimators/sketching.md). Target: softmax.
//   c = ⌈d / ln n⌉, u = U = min(c·⌈ln n⌉, n). For each query, U key indices uniformly with
//   replacement; sparsity M_i = max_sampled(s·q_i·k_j) − (1/n)·Σ_sampled(s·q_i·k_j) (divisor n,
//   as in Informer's code). The u queries with the largest M_i get their exact softmax row; every
//   other row gets mean(V). With u = n it is exact. Cost O(n·U·p + u·n·p).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/informer_params.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {

std::vector<int64_t> informer_active_rows(const HeadView& view, const RandomKey& key, const InformerParams& params) {
  const int64_t n = view.n();
  const double log_n = std::log(static_cast<double>(std::max<int64_t>(n, 2)));
  const int64_t c = static_cast<int64_t>(std::ceil(params.d / log_n));
  const int64_t u = std::min<int64_t>(c * static_cast<int64_t>(std::ceil(log_n)), n);
  const float scale = static_cast<float>(view.scale);

  const RandomStream stream(key, Purpose::kRowSample);
  std::vector<std::pair<float, int64_t>> sparsity(n);
  for (int64_t i = 0; i < n; ++i) {
    float max = -INFINITY;
    double sum = 0;
    for (int64_t s = 0; s < u; ++s) {
      const int64_t j = stream.index(static_cast<uint32_t>(n), static_cast<uint32_t>(i), static_cast<uint32_t>(s));
      const float logit = scale * view.qf.row(i).dot(view.kf.row(j));
      max = std::max(max, logit);
      sum += logit;
    }
    sparsity[i] = {max - static_cast<float>(sum / n), i};
  }
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
    const std::vector<int64_t> active = informer_active_rows(view, ctx.key, params_);
    out.setZero(view.n(), view.pv());  // mean(V) in every row, in place (as vmean)
    out.rowwise() += RowVectorF(segment_means(view.v, {Segment{0, view.v.rows()}}).cast<float>());
    MatrixF exact_rows;
    exact_attention_f32(view.qf(active, Eigen::all), view.kf, view.vf, static_cast<float>(view.scale), exact_rows);
    for (size_t r = 0; r < active.size(); ++r) out.row(active[r]) = exact_rows.row(r);
  }

  // Exact softmax rows for the active queries, uniform 1/n rows for the others.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    std::vector<char> is_active(view.n(), 0);
    for (int64_t i : informer_active_rows(view, ctx.key, params_)) is_active[i] = 1;
    return [&view, is_active](int64_t r0, int64_t rows) {
      MatrixD w = MatrixD::Constant(rows, view.k.rows(), 1.0 / view.k.rows());
      for (int64_t i = 0; i < rows; ++i)
        if (is_active[r0 + i]) w.row(i) = attention_rows_f64(view.q, view.k, view.scale, r0 + i, 1);
      return w;
    };
  }

 private:
  InformerParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "informer",
    .family = "sketching",
    .summary =
        "Informer ProbSparse: exact rows for the ~d queries with the largest sampled sparsity, mean(V) elsewhere",
    .params = {{"d", ParamKind::kInt, "64", 1, 1 << 24, {}, "budget: u = ceil(d/ln n)*ceil(ln n) exact rows"}},
    .samples_knob = "d",
    .random = true,
    .target = nullptr,
    .weights = true,
    .make = [](const Spec& spec) { return std::make_unique<Informer>(InformerParams::from_spec(spec)); },
});

}  // namespace
}  // namespace attnprobe
