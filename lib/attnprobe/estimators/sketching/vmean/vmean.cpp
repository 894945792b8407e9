#include "attnprobe/estimators/sketching/vmean/vmean.h"

#include <algorithm>

#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

class VMeanEstimator final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    if (view.mask == Mask::kFull) return mean_rows(view.vf, out, ctx.pool, view.n());
    visible_means(view, view.vf, out);
  }
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override {
    MatrixD out;
    if (view.mask == Mask::kFull)
      mean_rows(view.v, out, nullptr, view.n());
    else
      visible_means(view, view.v, out);
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
  // Uniform attention over the keys row i sees: Â_ij = 1/|V_i| on V_i (full: every key).
  WeightRows weights(const HeadView& view, const EstimateContext&) const override {
    return [&view](int64_t r0, int64_t rows) {
      MatrixD w = MatrixD::Zero(rows, view.keys());
      for (int64_t i = 0; i < rows; ++i) {
        const KeyRange seen = view.visible(r0 + i);
        w.row(i).segment(seen.begin, seen.size()).setConstant(1.0 / static_cast<double>(seen.size()));
      }
      return w;
    };
  }

  // One add per value entry: the rest is copying, so its fraction of the FMA peak says it is memory-bound.
  double flops(int64_t n, int64_t, int64_t pv) const override { return static_cast<double>(n) * pv; }

 private:
  // Row i of out: the mean of the values row i sees, summed in float64 in key order from the first one (no
  // n × pv temporary), for the float32 estimate and the float64 reference alike. Causal rows at consecutive
  // positions share one running sum from key 0, so a row's sum is the same additions whichever rows are
  // evaluated; a window row sums its own window.
  template <class Values, class Out>
  static void visible_means(const HeadView& view, const Values& v, Out& out) {
    out.resize(view.n(), v.cols());
    RowVectorD sum = RowVectorD::Zero(v.cols());
    int64_t next = 0;  // the running sum holds keys 0..next − 1
    for (int64_t i = 0; i < view.n(); ++i) {
      const KeyRange seen = view.visible(i);
      if (view.mask == Mask::kWindow) {
        sum.setZero();
        next = seen.begin;
      }
      for (; next < seen.end; ++next) sum += v.row(next).template cast<double>();
      out.row(i) = (sum / static_cast<double>(seen.size())).template cast<typename Out::Scalar>();
    }
  }
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<VMeanParams>{
    .name = "vmean",
    .family = "sketching",
    .summary = "rank-one baseline: every output row is the mean of V (uniform attention)",
    .page = "estimators/sketching.md",
    .capabilities = {.random = false,
                     .forms = kAllMasks,
                     .decode = kAllMasks,
                     .weights = kAllMasks,
                     // Nothing between the inputs and the output is stored: the mean is summed wider and stored once.
                     .rounding = "inputs and output in the precision; the output is the mean of the visible values, "
                                 "summed in float64 and stored once (no other intermediate)",
                     .backward = Backward::kOut,
                     .backward_forms = kFullAndCausal},
    .devices = {{.device = Device::kCuda, .forms = kFullAndCausal, .tolerance = 1e-6}},
    .make = [](const VMeanParams&) { return std::make_unique<VMeanEstimator>(); },
});

}  // namespace
}  // namespace attnprobe
