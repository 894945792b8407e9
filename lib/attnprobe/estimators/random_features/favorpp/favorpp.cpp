#include "attnprobe/estimators/random_features/favorpp/favorpp.h"

#include <fmt/format.h>

#include <cmath>
#include <type_traits>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {

namespace {

// The query features (n × M, or n × 2M trigonometric) and key features (keys × M or 2M) up to factors that
// cancel in the ratio, in precision S: what favorpp_attention contracts with V, and what weights() states.
template <typename S>
void favorpp_features(const GerfMap& map, const HeadView& view, const SliceData<S>& data, MatrixT<S>& query_features,
                      MatrixT<S>& key_features) {
  if (map.sign > 0) {
    // Per query row the constants (log D, −½ log M, −‖q̃‖²/2) and the shifts cancel in the ratio.
    query_features = gerf_log_features<S>(map, data.q, view.scale, true);
    key_features = gerf_log_features<S>(map, data.k, view.scale, false);
    exponentiate_features<S>(query_features, key_features);
  } else {
    // Trigonometric: features [cos(W_m·x̃), sin(W_m·x̃)]·exp(c_m + ‖x̃‖²/2). Query rows drop e^{‖q̃‖²/2}
    // (a per-row constant); keys keep e^{‖k̃‖²/2} under one shift per slice.
    const S root_scale = static_cast<S>(std::sqrt(view.scale));
    const MatrixT<S> q_scaled = root_scale * data.q, k_scaled = root_scale * data.k;
    const int64_t count = map.projections.rows();
    const RowVectorT<S> offsets = map.offsets.cast<S>().transpose();
    const MatrixT<S> w = map.projections.cast<S>();
    auto trig = [&](const MatrixT<S>& x, const MatrixT<S>& log_weight) {
      const MatrixT<S> phase = x * w.transpose();
      MatrixT<S> out(x.rows(), 2 * count);
      out.leftCols(count) = phase.array().cos() * log_weight.array().exp();
      out.rightCols(count) = phase.array().sin() * log_weight.array().exp();
      return out;
    };
    const MatrixT<S> query_log = (offsets.array() - offsets.maxCoeff()).matrix().replicate(q_scaled.rows(), 1);
    MatrixT<S> key_log = offsets.replicate(k_scaled.rows(), 1);
    key_log.colwise() += S(0.5) * k_scaled.rowwise().squaredNorm();
    key_log.array() -= key_log.maxCoeff();
    query_features = trig(q_scaled, query_log);
    key_features = trig(k_scaled, key_log);
  }
}

}  // namespace

template <typename S>
MatrixT<S> favorpp_attention(const FavorppParams& params, const HeadView& view, RandomKey key, GerfMap* fitted,
                             Precision stored) {
  const GerfMap map = fit_gerf(params.gerf, view.q, view.k, view.scale, params.features, params.orthogonal, key);
  if (fitted) *fitted = map;
  // Each tensor a GPU kernel stores between its steps, rounded to `stored` (float32 and float64: left as they are).
  const auto store = [stored](auto& tensor) {
    if constexpr (std::is_same_v<S, float>) round_in_place(tensor.data(), tensor.size(), stored);
  };
  const SliceData<S> data = slice_data<S>(view);
  MatrixT<S> query_features, key_features;
  favorpp_features<S>(map, view, data, query_features, key_features);
  store(query_features);
  store(key_features);
  MatrixT<S> kv = key_features.transpose() * data.v;              // M × pv
  VectorT<S> key_sum = key_features.colwise().sum().transpose();  // M
  store(kv);
  store(key_sum);
  MatrixT<S> numerator = query_features * kv;         // n × pv
  VectorT<S> denominator = query_features * key_sum;  // n
  store(numerator);
  store(denominator);
  return numerator.array().colwise() / denominator.array();
}

template MatrixT<float> favorpp_attention<float>(const FavorppParams&, const HeadView&, RandomKey, GerfMap*, Precision);
template MatrixT<double> favorpp_attention<double>(const FavorppParams&, const HeadView&, RandomKey, GerfMap*,
                                                   Precision);

namespace {

class Favorpp final : public Estimator {
 public:
  explicit Favorpp(FavorppParams params) : params_(std::move(params)) {}

  // Positive maps take the blocked float32 forward Performer uses (feature_attention.h: row blocks on the
  // pool, never n × M); the trigonometric branch is not positive and keeps favorpp_attention.
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    if (params_.gerf.sign < 0) {
      out = favorpp_attention<float>(params_, view, ctx.key, nullptr, ctx.precision);
      return;
    }
    const GerfMap map =
        fit_gerf(params_.gerf, view.qf, view.kf, view.scale, params_.features, params_.orthogonal, ctx.key, ctx.pool);
    positive_feature_attention(gerf_feature_map_f32(map, view.scale), view.qf, view.kf, view.vf, ctx.pool, out, 0,
                               ctx.precision);
  }

  // Â_ij = φ(q_i)·φ(k_j) / φ(q_i)·Σ_j′ φ(k_j′) with the fitted map of estimate() (same ω, same A), in
  // float64. Rows sum to one; entries are positive for s=1 and of either sign for the trigonometric s=−1
  // (whose denominators can be ≤ 0). Setup O(n·M·p); O(rows·keys·M) per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    require_usage(view.mask == Mask::kFull, "favorpp has no causal form");
    const GerfMap map =
        fit_gerf(params_.gerf, view.q, view.k, view.scale, params_.features, params_.orthogonal, ctx.key);
    MatrixD query_features, key_features;
    favorpp_features<double>(map, view, slice_data<double>(view), query_features, key_features);
    VectorD key_sum = key_features.colwise().sum().transpose();
    return [query_features = std::move(query_features), key_features = std::move(key_features),
            key_sum = std::move(key_sum)](int64_t r0, int64_t rows) {
      const auto a = query_features.middleRows(r0, rows);
      MatrixD w = a * key_features.transpose();
      w.array().colwise() /= (a * key_sum).array();
      return w;
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * n * params_.features * p + 2.0 * 2.0 * n * params_.features * pv;
  }

 private:
  FavorppParams params_;
};

const std::string kFavorppRounding =
    std::string("positive maps (s=1): ") + kRandomFeatureRounding +
    "; trigonometric maps (s=-1): the features [cos, sin]·exp(·) (keys shifted by their largest log-weight, so ≤ 1) "
    "stored in the precision, the key state Σφ(k)vᵀ and Σφ(k), the numerator and the denominator accumulated float32 "
    "and stored, output rounded";

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<FavorppParams>{
    .name = "favorpp",
    .family = "random-features",
    .summary = "FAVOR++: Performer with CRT's optimal positive features (closed-form A*), FAVOR# variants arf/sderf "
               "(O(n M p))",
    .page = "estimators/beyond.md",
    .params = ParamSet<FavorppParams>()
                  .integer("M", &FavorppParams::features, 1, 1 << 20, "random features")
                  .integer("ortho", &FavorppParams::orthogonal, 0, 1,
                           "1: orthogonal blocks of features (norms ~ chi_p); 0: iid")
                  .real_or_word(
                      "a", "opt", [](FavorppParams& p) -> auto& { return p.gerf.optimal_a; },
                      [](FavorppParams& p) -> auto& { return p.gerf.a; }, -1e6, 0.125,
                      "A: opt (closed form per slice) or a number < 1/8")
                  .choice(
                      "variant", [](FavorppParams& p) -> auto& { return p.gerf.variant; },
                      {{"oprf", GerfVariant::kOprf}, {"arf", GerfVariant::kArf}, {"sderf", GerfVariant::kSderf}},
                      "oprf (one A), arf (coordinate rescale, then oprf), sderf (one A per eigendirection)")
                  .integer(
                      "arf_ref", [](FavorppParams& p) -> auto& { return p.gerf.arf_reference; }, 0, 1,
                      "1: ARF's rescale as google-research codes it (inverse)")
                  .integer(
                      "s", [](FavorppParams& p) -> auto& { return p.gerf.sign; }, -1, 1,
                      "1: positive features; -1: trigonometric (not positive)")
                  .check([](const FavorppParams& p) {
                    if (!p.gerf.optimal_a && !(p.gerf.a < 0.125))
                      throw UsageError(fmt::format(
                          "favorpp: a = {} must be below 1/8 (the features' second moment is infinite from 1/8 on)",
                          p.gerf.a));
                    if (p.gerf.sign == 0)
                      throw UsageError("favorpp: s must be 1 (positive features) or -1 (trigonometric)");
                    if (p.gerf.sign == -1 && (p.gerf.variant != GerfVariant::kOprf || p.gerf.optimal_a))
                      throw UsageError(
                          "favorpp: s=-1 needs variant=oprf and a numeric a (its optimal A is not derived here)");
                  }),
    .samples_knob = "M",
    .capabilities = {.random = true, .weights = kFullOnly, .rounding = kFavorppRounding.c_str()},
    .ablations = {"favorpp(ortho=0)", "favorpp(variant=arf,arf_ref=1)"},  // iid features; ARF as the reference codes it
    .make = [](const FavorppParams& params) { return std::make_unique<Favorpp>(params); },
});

}  // namespace
}  // namespace attnprobe
