#include "attnprobe/estimators/sketching/vmean/vmean.h"

#include <algorithm>

#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

class VMeanEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    if (view.mask == Mask::kCausal) return prefix_means(view.vf, out);
    mean_rows(view.vf, out, ctx.pool);
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override {
    MatrixD out;
    if (view.mask == Mask::kCausal)
      prefix_means(view.v, out);
    else
      mean_rows(view.v, out);
    return out;
  }
  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext&) const override {
    Gradients out;
    out.q = MatrixD::Zero(view.n(), view.p());
    if (view.mask == Mask::kCausal) {
      out.v = MatrixD::Zero(view.k.rows(), view.pv());  // keys past the last query are seen by none
      RowVectorD suffix = RowVectorD::Zero(view.pv());
      for (int64_t j = view.n() - 1; j >= 0; --j) {
        suffix += upstream.row(j) / static_cast<double>(j + 1);
        out.v.row(j) = suffix;
      }
      return out;
    }
    out.v = (upstream.colwise().sum() / static_cast<double>(view.k.rows())).replicate(view.k.rows(), 1);
    return out;
  }
  // Uniform attention: Â_ij = 1/keys (causal: 1/(i+1) for j ≤ i).
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    return [keys = view.v.rows(), mask = view.mask](int64_t r0, int64_t rows) {
      MatrixD w = MatrixD::Zero(rows, keys);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t seen = mask == Mask::kCausal ? std::min(r0 + i + 1, keys) : keys;
        w.row(i).head(seen).setConstant(1.0 / static_cast<double>(seen));
      }
      return w;
    };
  }

  // One add per value entry: the rest is copying, so its fraction of the FMA peak says it is memory-bound.
  double flops(int64_t n, int64_t, int64_t pv) const override { return static_cast<double>(n) * pv; }

 private:
  // Row i of out: the mean of rows 0..i of v (n × pv), one pass with the running sum in float64
  // (no n × pv temporary), in token order; for the float32 estimate and the float64 reference alike.
  template <class Values, class Out>
  static void prefix_means(const Values& v, Out& out) {
    out.resize(v.rows(), v.cols());
    RowVectorD sum = RowVectorD::Zero(v.cols());
    for (int64_t i = 0; i < v.rows(); ++i) {
      sum += v.row(i).template cast<double>();
      out.row(i) = (sum / static_cast<double>(i + 1)).template cast<typename Out::Scalar>();
    }
  }
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<VMeanParams>{
    .name = "vmean",
    .family = "sketching",
    .summary = "rank-one baseline: every output row is the mean of V (uniform attention)",
    .page = "estimators/sketching.md",
    .capabilities = {.random = false,
                     .forms = kFullAndCausal,
                     .weights = kFullAndCausal,
                     .backward = Backward::kOut,
                     .backward_forms = kFullAndCausal},
    .devices = {{.device = Device::kCuda, .forms = kFullAndCausal, .tolerance = 1e-6}},
    .make = [](const VMeanParams&) { return std::make_unique<VMeanEstimator>(); },
});

}  // namespace
}  // namespace attnprobe
