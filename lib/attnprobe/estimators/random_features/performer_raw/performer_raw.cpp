#include "attnprobe/estimators/random_features/performer_raw/performer_raw.h"

#include <cmath>
#include <string>

#include "attnprobe/estimators/random_features/feature_attention.h"
#include "attnprobe/estimators/random_features/performer/performer_map.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

class PerformerRaw final : public Estimator {
 public:
  explicit PerformerRaw(PerformerParams params) : params_(params) {}

  // performer's full form without its shifts: the textbook map's ‖x̃‖²/2 on both sides and the M^{-1/2} as an
  // offset of every log-feature.
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    PositiveFeatureMapF map = performer_feature_map(view, ctx, params_);
    map.offsets = RowVectorF::Constant(params_.features,
                                       static_cast<float>(-0.5 * std::log(static_cast<double>(params_.features))));
    map.shifted = false;
    positive_feature_attention(map, view.qf, view.kf, view.vf, ctx.pool, out, view.first_position, ctx.precision);
  }

  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    return 8.0 * params_.features * p + positive_feature_attention_bytes(params_.features, p, pv);
  }
  // performer's: Q·ω and K·ω, the key sums and the output.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * n * params_.features * p + 2.0 * 2.0 * n * params_.features * pv;
  }

 private:
  PerformerParams params_;
};

const std::string kPerformerRawRounding = std::string(kRandomFeatureRounding) + " (unshifted: features can underflow)";

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<PerformerParams>{
    .name = "performer-raw",
    .family = "random-features",
    .summary = "Performer without its log-space shifts: the textbook map exp(w.x - |x|^2/2)/sqrt(M) (precision study)",
    .page = "estimators/random-features.md",
    .params = performer_param_set(),
    .samples_knob = "M",
    .capabilities = {.random = true, .decode = kFullOnly, .rounding = kPerformerRawRounding.c_str()},
    .make = [](const PerformerParams& params) { return std::make_unique<PerformerRaw>(params); },
});

}  // namespace
}  // namespace attnprobe
