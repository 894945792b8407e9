#include "attnprobe/estimators/random_features/performer/performer.h"
#include "attnprobe/estimators/random_features/performer/performer_map.h"

#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/common/decode_blocks.h"
#include "attnprobe/estimators/random_features/feature_attention.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/registry.h"

namespace attnprobe {
namespace {

class Performer final : public Estimator {
 public:
  explicit Performer(PerformerParams params) : features_(params.features), orthogonal_(params.orthogonal) {}

  // The forward pass of a sweep and `bench`: float32, blocked over rows, never n × M
  // (feature_attention.h; √s folded into the projections: ω·q̃ = (√s·ω)·q).
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    if (view.mask == Mask::kCausal) return estimate_causal(view, ctx, out);
    positive_feature_attention(performer_feature_map(view, ctx, {features_, orthogonal_}), view.qf, view.kf, view.vf,
                               ctx.pool, out, view.first_position, ctx.precision);
  }

  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext& ctx) const override {
    if (view.mask == Mask::kCausal) return backward_causal(view, upstream, ctx);
    const Forward f = forward(view, ctx);
    const VectorD g_dot_out = (upstream.array() * f.out.array()).rowwise().sum();
    MatrixD coefficient = upstream * f.kv.transpose();  // n × M: g_i·kv_m, then ∂L/∂a_im·a_im
    coefficient -= g_dot_out * f.key_sum.transpose();
    coefficient = (coefficient.array() * f.query_features.array()).colwise() / f.denominator.array();
    Gradients out;
    out.q = std::sqrt(view.scale) * coefficient * f.omegas;
    const MatrixD scaled_queries = f.query_features.array().colwise() / f.denominator.array();
    out.v = f.key_features * (scaled_queries.transpose() * upstream);
    return out;
  }

  // Â_ij = φ(q_i)·φ(k_j) / φ(q_i)·Σ_j′ φ(k_j′) (rows sum to one, entries positive), from the same ω as
  // estimate(). The features are formed here on their own (the per-row query shift and the one key shift
  // cancel in the ratio, as in estimate) so that this stays independent of how estimate() is evaluated.
  // Causal: the sums run over j, j′ ≤ i (the causal form's prefix sums). Setup O(n·M·p); O(rows·keys·M)
  // per block.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    if (view.mask == Mask::kCausal) return causal_weights(view, ctx);
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);  // M × p
    MatrixD query_logits = (root_scale * view.q) * omegas.transpose();              // n × M
    MatrixD key_features = log_features(root_scale * view.k, omegas);               // keys × M
    key_features = (key_features.array() - key_features.maxCoeff()).exp();
    VectorD key_sum = key_features.colwise().sum().transpose();
    return [query_logits = std::move(query_logits), key_features = std::move(key_features),
            key_sum = std::move(key_sum)](int64_t r0, int64_t rows) {
      MatrixD a = query_logits.middleRows(r0, rows);  // rows × M
      for (int64_t i = 0; i < rows; ++i) a.row(i).array() = (a.row(i).array() - a.row(i).maxCoeff()).exp();
      const VectorD denominator = a * key_sum;
      MatrixD w = a * key_features.transpose();  // rows × keys
      w.array().colwise() /= denominator.array();
      return w;
    };
  }

  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * n * features_ * p + 2.0 * 2.0 * n * features_ * pv;
  }

  // The causal form's Â: φ(q_i)·φ(k_j) / Σ_{j′≤i} φ(q_i)·φ(k_j′) for j ≤ i, 0 after. A later key can
  // dwarf the early ones, so one shift over all keys could underflow a prefix to 0/0: each feature f
  // keeps its own key shift c_f (the largest log φ_f(k_j)), carried by the queries as exp(log φ_f(q_i) +
  // c_f − max_f′(…)) ≤ 1; a row whose prefix still underflows (log-feature gaps beyond ~700) is
  // recomputed entry by entry in log space.
  WeightRows causal_weights(const HeadView& view, const EstimateContext& ctx) const {
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);  // M × p
    MatrixD log_q = log_features(root_scale * view.q, omegas);                      // n × M
    MatrixD log_k = log_features(root_scale * view.k, omegas);                      // keys × M
    const RowVectorD shift = log_k.colwise().maxCoeff();
    MatrixD key_features = (log_k.rowwise() - shift).array().exp();
    return [&view, log_q = std::move(log_q), log_k = std::move(log_k), shift, key_features = std::move(key_features)](
               int64_t r0, int64_t rows) {
      MatrixD a = log_q.middleRows(r0, rows).rowwise() + shift;  // rows × M
      for (int64_t i = 0; i < rows; ++i) a.row(i).array() = (a.row(i).array() - a.row(i).maxCoeff()).exp();
      MatrixD w = a * key_features.transpose();  // rows × keys
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r0 + r, seen = view.visible(i).end;
        w.row(r).tail(w.cols() - seen).setZero();
        double total = w.row(r).sum();
        if (!(total > 0) || !std::isfinite(total)) {  // underflowed: log φ(q_i)·φ(k_j) = logsumexp_f(…)
          const RowVectorD q_row = log_q.row(i);
          VectorD log_w(seen);
          for (int64_t j = 0; j < seen; ++j) {
            const Eigen::ArrayXd terms = (q_row + log_k.row(j)).array().transpose();
            log_w(j) = terms.maxCoeff() + std::log((terms - terms.maxCoeff()).exp().sum());
          }
          w.row(r).head(seen) = (log_w.array() - log_w.maxCoeff()).exp().transpose();
          total = w.row(r).sum();
        }
        w.row(r) /= total;
      }
      return w;
    };
  }

  // estimate(): ω (M × p, float64) and the blocked forward's buffers (feature_attention.h; the output is
  // the caller's). backward() forms the n × M features in float64.
  double memory_bytes(int64_t, int64_t p, int64_t pv) const override {
    return 8.0 * features_ * p + positive_feature_attention_bytes(features_, p, pv);
  }
  // backward(), either form: four n × M float64 matrices (features or log-features of both sides and the
  // coefficients), the M × pv sums, ω and the gradients.
  double backward_memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    return 8.0 * (4.0 * n * features_ + 2.0 * features_ * (p + pv) + static_cast<double>(n) * (p + pv));
  }

  // The causal form (mask = causal): S_i = Σ_{j≤i} φ(k_j)ᵀv_j and z_i = Σ_{j≤i} φ(k_j), one token at a
  // time in float64. Each feature keeps the running maximum c_m of the key log-features seen so far
  // and rescales S and z by exp(c_old − c_new) when it grows (online softmax), so every prefix sum holds
  // a 1 and cannot underflow, and nothing a later token brings touches an earlier row. Query i weighs
  // feature m by exp(log ξ(q_i, ω_m) + c_m − max_m′(…)), so its denominator is ≥ 1. The ω are the
  // full form's (drawn from the key alone, independent of n), so row i equals the full estimate of
  // the prefix 0..i (tested). Rows at positions t (a decode step: the last rows against the whole cache)
  // run the same sums from key 0, and keys and queries are formed in blocks aligned to absolute positions,
  // so a row's bits do not depend on which rows are evaluated. O(keys·M·(p + pv)) time, O(256·M + M·pv)
  // memory. Below float32 the state is stored in the precision after every key and the query's features before
  // their products (kRecurrentStateRounding): what a recurrent kernel that keeps its state in the cache's dtype
  // computes.
  void estimate_causal(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const {
    const int64_t n = view.n(), keys = view.keys(), pv = view.pv();
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);
    CausalFeatureSums sums(features_, pv, ctx.precision);
    RowVectorD weights(features_);
    MatrixD log_k;     // the log-features of the key block holding key `next`
    int64_t next = 0;  // the sums hold keys 0..next − 1
    out.resize(n, pv);
    for (int64_t r0 = 0; r0 < n;) {
      const auto [rows, lead] = aligned_block(view.position(r0), n - r0, kRowBlock);               // decode_blocks.h
      const MatrixD log_q = log_features(root_scale * with_lead(view.q, r0, rows, lead), omegas);  // lead + rows × M
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r0 + r;
        for (const int64_t seen = view.visible(i).end; next < seen; ++next) {
          if (next % kRowBlock == 0)
            log_k = log_features(root_scale * view.k.middleRows(next, std::min(kRowBlock, keys - next)), omegas);
          sums.add(log_k.row(next % kRowBlock), view.v.row(next));
        }
        weights = log_q.row(lead + r) + sums.shift;
        weights = (weights.array() - weights.maxCoeff()).exp();
        store_below_float32(weights, ctx.precision);
        out.row(i) = (weights * sums.kv / weights.dot(sums.z)).cast<float>();
      }
      r0 += rows;
    }
  }

  // The causal form's backward, L = ⟨G, Y⟩ with Y_i = a_i·S_i / a_i·z_i, token by token in float64:
  //   ∂L/∂a_im = (g_i·S_i[m] − (g_i·Y_i)·z_i[m]) / D_i,  ∇_q_i = √s·Σ_m a_im·∂L/∂a_im·ω_m   (prefix sums, as
  //   estimate_causal: each feature's running key shift, carried by the query, so nothing underflows);
  //   ∇_V_j = Σ_{i≥j} Σ_m φ_m(k_j)·w_im·g_i,  w_im = φ_m(q_i)/Σ_{j′≤i} φ(q_i)·φ(k_j′)   (suffix sums: the
  //   same running-shift sums taken backwards, queries' log w_i as the "keys" and g_i as the values).
  // Every term φ_m(q_i)φ_m(k_j)/D_i of the suffix read is ≤ 1 (a row of Â sums to one), so the keys' reads
  // exp(log φ_m(k_j) + shift_m) cannot overflow. O(n·M·(p + pv)) time, O(n·M) memory.
  std::optional<Gradients> backward_causal(const HeadView& view, const MatrixD& g, const EstimateContext& ctx) const {
    const int64_t n = view.n();
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);  // M × p
    const MatrixD log_q = log_features(root_scale * view.q, omegas);                // n × M
    const MatrixD log_k = log_features(root_scale * view.k.topRows(n), omegas);     // keys past n: seen by none
    MatrixD coefficient(n, features_), log_w(n, features_);
    CausalFeatureSums prefix(features_, view.pv());
    for (int64_t i = 0; i < n; ++i) {
      prefix.add(log_k.row(i), view.v.row(i));
      const RowVectorD shifted = log_q.row(i) + prefix.shift;
      const double top = shifted.maxCoeff();
      const RowVectorD a = (shifted.array() - top).exp();
      const double denominator = a.dot(prefix.z);  // ≥ 1: the top feature's query weight and key sum hold a 1
      const RowVectorD y = a * prefix.kv / denominator;
      coefficient.row(i) =
          (g.row(i) * prefix.kv.transpose() - g.row(i).dot(y) * prefix.z).cwiseProduct(a) / denominator;
      log_w.row(i) = log_q.row(i).array() - (top + std::log(denominator));  // log φ(q_i) − log D_i, unshifted
    }
    Gradients out;
    out.q = root_scale * coefficient * omegas;
    out.v = MatrixD::Zero(view.k.rows(), view.pv());
    CausalFeatureSums suffix(features_, view.pv());
    for (int64_t j = n - 1; j >= 0; --j) {
      suffix.add(log_w.row(j), g.row(j));
      out.v.row(j) = (log_k.row(j) + suffix.shift).array().exp().matrix() * suffix.kv;
    }
    return out;
  }

 private:
  static constexpr int64_t kRowBlock = 256;  ///< causal form: rows of log-features formed at once

  struct Forward {
    MatrixD omegas;          ///< M × p
    MatrixD query_features;  ///< n × M, a_i up to a per-row factor that cancels
    MatrixD key_features;    ///< keys × M, φ(k_j) up to one factor that cancels
    MatrixD kv;              ///< M × pv: Σ_j φ(k_j)ᵀ v_j
    VectorD key_sum;         ///< M: Σ_j φ(k_j)
    VectorD denominator;     ///< n: a_i·key_sum
    MatrixD out;             ///< n × pv
  };

  Forward forward(const HeadView& view, const EstimateContext& ctx) const {
    const double root_scale = std::sqrt(view.scale);
    Forward f;
    f.omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);
    // Queries: ‖q̃‖²/2 and M^{-1/2} cancel in the ratio, so only ω·q̃ minus its row max remains.
    f.query_features = (root_scale * view.q) * f.omegas.transpose();
    for (int64_t i = 0; i < f.query_features.rows(); ++i)
      f.query_features.row(i).array() = (f.query_features.row(i).array() - f.query_features.row(i).maxCoeff()).exp();
    f.key_features = log_features(root_scale * view.k, f.omegas);
    f.key_features = (f.key_features.array() - f.key_features.maxCoeff()).exp();
    f.kv = f.key_features.transpose() * view.v;
    f.key_sum = f.key_features.colwise().sum().transpose();
    f.denominator = f.query_features * f.key_sum;
    f.out = (f.query_features * f.kv).array().colwise() / f.denominator.array();
    return f;
  }

  int64_t features_;
  bool orthogonal_;
};

}  // namespace

PositiveFeatureMapF performer_feature_map(const HeadView& view, const EstimateContext& ctx,
                                          const PerformerParams& params) {
  PositiveFeatureMapF map;
  map.query_t = (std::sqrt(view.scale) * draw_omegas(params.features, view.p(), params.orthogonal, ctx.key, ctx.pool))
                    .cast<float>()
                    .transpose();
  map.key_t = map.query_t;
  map.key_square_weight = static_cast<float>(0.5 * view.scale);
  return map;
}

const ParamSet<PerformerParams>& performer_param_set() {
  static const ParamSet<PerformerParams> kKeys =
      ParamSet<PerformerParams>()
          .integer("M", &PerformerParams::features, 1, 1 << 20, "random features")
          .integer("ortho", &PerformerParams::orthogonal, 0, 1,
                   "1: orthogonal blocks of features (norms ~ chi_p); 0: iid");
  return kKeys;
}

namespace {

const std::string kPerformerRounding = std::string("full mask and its decode rows: ") + kRandomFeatureRounding +
                                       "; causal form: " + kRecurrentStateRounding;

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<PerformerParams>{
    .name = "performer",
    .family = "random-features",
    .summary = "Performer/RFA positive random features, log-space stabilised, no epsilon (O(n M p))",
    .page = "estimators/random-features.md",
    .params = performer_param_set(),
    .samples_knob = "M",
    .capabilities = {.random = true,
                     .forms = kFullAndCausal,
                     .decode = kFullAndCausal,
                     .weights = kFullAndCausal,
                     .rounding = kPerformerRounding.c_str(),
                     .backward = Backward::kOut,
                     .backward_forms = kFullAndCausal},
    // The same features, float64 sums on the device against float32 on the CPU.
    .devices = {{.device = Device::kCuda, .forms = kFullAndCausal, .tolerance = 1e-4}},
    .ablations = {"performer(ortho=0)"},
    .make = [](const PerformerParams& params) { return std::make_unique<Performer>(params); },
});

}  // namespace
}  // namespace attnprobe
