#include "attnprobe/estimators/sketching/skeinformer/skeinformer.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "attnprobe/common/rounding.h"
#include "attnprobe/estimators/common/landmarks.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/exact/tile_product.h"

namespace attnprobe {

SkeinformerSample skeinformer_sample(const HeadView& view, const RandomKey& key, const SkeinformerParams& params,
                                     ThreadPool* pool, int64_t kept_logits) {
  const int64_t n = view.n();
  const float scale = static_cast<float>(view.scale);
  const int64_t d_eff = params.sketch_size(n);
  SkeinformerSample sample;
  if (!params.importance) {
    sample.columns = sample_uniform_without_replacement(n, d_eff, RandomStream(key, Purpose::kColumnSample));
    return sample;
  }
  const RandomStream rows(key, Purpose::kRowSample);
  for (int64_t s = 0; s < d_eff; ++s)
    sample.pilot.push_back(rows.index(static_cast<uint32_t>(n), static_cast<uint32_t>(s)));
  const MatrixF q_pilot = view.qf(sample.pilot, Eigen::all);
  // The exact rows B_J·V and each pilot row's log-normaliser, on the chunked exact kernel (O(d·n·p)). The
  // column norms below need B_J = exp(logit − log-normaliser), so its logits come after the normalisers:
  // kept from this pass while d_eff × n floats fit in kept_logits, formed again otherwise (the d × n × p
  // product a second time: ~15% of a call at n = 1024–4096, d = 256).
  const bool keep_logits = params.keeps_pilot_logits(n, kept_logits);
  VectorD log_norm;
  MatrixF logits;  // d_eff × n when kept
  key_chunked_attention_f32(q_pilot, view.kf, view.vf, scale, nullptr, sample.pilot_out, &log_norm, pool, {},
                            keep_logits ? &logits : nullptr);
  const RowVectorF shift = log_norm.transpose().cast<float>();
  // Column norms ‖B_J[:, c]‖₂ per block of keys, squared and summed over the pilot rows in float64. Each
  // column's sum has one owner: bits independent of the pool.
  std::vector<double> weights(n);
  constexpr int64_t kKeyBlock = 512;
  MatrixF q_pilot_t;  // p × d_eff, for the tile products when the logits are formed again
  if (!keep_logits) transpose_scaled(q_pilot, scale, q_pilot_t);
  for_each_index(pool, (n + kKeyBlock - 1) / kKeyBlock, [&](int64_t block) {
    const int64_t c0 = block * kKeyBlock, cols = std::min(kKeyBlock, n - c0);
    Eigen::ArrayXd squares = Eigen::ArrayXd::Zero(cols);
    if (keep_logits) {
      thread_local Eigen::ArrayXf probs;     // Eigen-allocated, so exp splits it alike on every thread
      for (int64_t i = 0; i < d_eff; ++i) {  // the pilot rows in order, along contiguous logits
        probs = logits.row(i).segment(c0, cols).array() - shift(i);
        probs = probs.exp();
        squares += probs.cast<double>().square();
      }
    } else {
      thread_local MatrixF probs;  // cols × d_eff: the block transposed, so each column of B_J is a row here
      tile_product(view.kf.middleRows(c0, cols), q_pilot_t, probs);
      probs.rowwise() -= shift;
      probs = probs.array().exp();
      for (int64_t c = 0; c < cols; ++c) squares(c) = squared_norm_f64(probs.row(c).data(), d_eff);
    }
    for (int64_t c = 0; c < cols; ++c) weights[c0 + c] = std::sqrt(squares(c)) * view.v.row(c0 + c).norm();
  });
  if (std::none_of(weights.begin(), weights.end(), [](double w) { return w > 0; }))
    std::fill(weights.begin(), weights.end(), 1.0);  // V = 0: any columns give the same (zero) output
  sample.columns = sample_without_replacement(weights, d_eff, RandomStream(key, Purpose::kColumnSample));
  sample.column_weights = std::move(weights);
  return sample;
}

namespace {

class Skeinformer final : public Estimator {
 public:
  explicit Skeinformer(SkeinformerParams params) : params_(params) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), pv = view.pv();
    const float scale = static_cast<float>(view.scale);

    // Steps 1-3: the columns J′ (and the pilot rows J when sampling by importance).
    const SkeinformerSample sample = skeinformer_sample(view, ctx.key, params_, ctx.pool);
    const std::vector<int64_t>& columns = sample.columns;

    // Steps 4-5 on the selected columns, in independent blocks of kRowBlock query rows on the call's pool
    // (the n × |J′| logits are never formed; each row's products are GEMMs over its block, not GEMVs).
    const MatrixF k_sel = view.kf(columns, Eigen::all), v_sel = view.vf(columns, Eigen::all);
    MatrixF k_sel_t;  // p × |J′|: s·K_J′ᵀ for the tile products
    transpose_scaled(k_sel, scale, k_sel_t);
    const int64_t selected = static_cast<int64_t>(columns.size());
    // Σ_j v_j in float64 along contiguous rows (a colwise() sum strides down the row-major columns).
    const RowVectorF v_total =
        (static_cast<double>(view.v.rows()) * segment_means(view.v, {Segment{0, view.v.rows()}})).cast<float>().row(0);
    RowVectorF v_missing = v_total - v_sel.cast<double>().colwise().sum().cast<float>();
    // Below float32 (its rounding declaration) the unselected values' sum is stored, and each row's exponentials are
    // stored for their product with the selected values after their float32 row sum: FlashAttention-2's points
    // over the selected columns. round_in_place leaves float32 as it is.
    round_in_place(v_missing.data(), v_missing.size(), ctx.precision);
    const float unselected = static_cast<float>(n - selected);
    out.resize(n, pv);
    for_each_index(ctx.pool, (n + kRowBlock - 1) / kRowBlock, [&](int64_t block) {
      const int64_t r0 = block * kRowBlock, rows = std::min(kRowBlock, n - r0);
      thread_local MatrixF logits;  // rows × |J′|
      tile_product(view.qf.middleRows(r0, rows), k_sel_t, logits);
      VectorF shift(rows), fill(rows);  // per row: the subtracted maximum, and g_i (adaptive) or 0
      if (params_.rownorm == RowNorm::kExact) {
        // Exact denominator: D_ii = Σ_j exp(s·q_i·k_j − m_i) with m_i the full row max (O(n²p)).
        const MatrixF full = scale * (view.qf.middleRows(r0, rows) * view.kf.transpose());
        VectorF denominator(rows);
        for (int64_t i = 0; i < rows; ++i) {
          shift(i) = full.row(i).maxCoeff();
          const RowVectorF terms = (full.row(i).array() - shift(i)).exp();
          denominator(i) = static_cast<float>(sum_f64(terms.data(), terms.size()));
        }
        logits.colwise() -= shift;
        logits = logits.array().exp();
        round_in_place(logits, ctx.precision);
        out.middleRows(r0, rows).noalias() = logits * v_sel;
        out.middleRows(r0, rows).array().colwise() /= denominator.array();
        return;
      }
      for (int64_t i = 0; i < rows; ++i) {
        shift(i) = logits.row(i).maxCoeff();
        // log of the geometric mean of a_ic, then g_i itself
        fill(i) = params_.rownorm == RowNorm::kAdaptive ? std::exp(logits.row(i).mean() - shift(i)) : 0.0f;
      }
      logits.colwise() -= shift;
      logits = logits.array().exp();
      const VectorF denominator = logits.rowwise().sum() + unselected * fill;
      round_in_place(logits, ctx.precision);
      auto rows_out = out.middleRows(r0, rows);
      tile_product_assign(logits.data(), selected, rows, selected, v_sel.data(), pv, pv, out.row(r0).data(), pv);
      rows_out.noalias() += fill * v_missing;  // the fill g_i on every unselected column
      rows_out.array().colwise() /= denominator.array();
    });

    // Step 6: pilot reuse (Algorithm 1); not with uniform columns or simple row normalisation.
    if (!params_.reuses_pilot()) return;
    // Below float32 the pilot rows are exact attention at softmax's rounding points, not the float32 pilot's.
    MatrixF rounded_pilot;
    if (below_float32(ctx.precision))
      exact_attention_rounded(view.qf(sample.pilot, Eigen::all), view.kf, view.vf, scale, ctx.precision, rounded_pilot,
                              ctx.pool, QueryGeometry{});
    const MatrixF& pilot_out = below_float32(ctx.precision) ? rounded_pilot : sample.pilot_out;
    for (size_t r = 0; r < sample.pilot.size(); ++r) out.row(sample.pilot[r]) = pilot_out.row(r);
  }

  // Â row by row: pilot rows (when reused) are exact softmax rows; otherwise the a_ic of the selected
  // columns over the row's denominator and, with adaptive normalisation, the fill g_i on every
  // unselected column.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    SkeinformerSample sample = skeinformer_sample(view, ctx.key, params_);
    std::vector<char> exact_row(view.n(), 0);
    if (params_.reuses_pilot())
      for (int64_t i : sample.pilot) exact_row[i] = 1;
    return
        [rownorm = params_.rownorm, &view, columns = std::move(sample.columns), exact_row](int64_t r0, int64_t rows) {
          const int64_t unselected = view.k.rows() - static_cast<int64_t>(columns.size());
          const MatrixD k_sel = view.k(columns, Eigen::all);
          MatrixD w = MatrixD::Zero(rows, view.k.rows());
          for (int64_t i = 0; i < rows; ++i) {
            if (exact_row[r0 + i]) {
              w.row(i) = attention_rows_f64(view.q, view.k, view.scale, r0 + i, 1);
              continue;
            }
            const Eigen::RowVectorXd logits = view.scale * (view.q.row(r0 + i) * k_sel.transpose());
            double shift = logits.maxCoeff(), denominator = 0;
            if (rownorm == RowNorm::kExact) {
              const Eigen::RowVectorXd full = view.scale * (view.q.row(r0 + i) * view.k.transpose());
              shift = full.maxCoeff();
              denominator = (full.array() - shift).exp().sum();
            } else {
              denominator = (logits.array() - shift).exp().sum();
              if (rownorm == RowNorm::kAdaptive) {
                const double fill = std::exp(logits.mean() - shift);
                denominator += static_cast<double>(unselected) * fill;
                w.row(i).setConstant(fill / denominator);
              }
            }
            for (size_t c = 0; c < columns.size(); ++c)
              w(i, columns[c]) = std::exp(logits[static_cast<int64_t>(c)] - shift) / denominator;
          }
          return w;
        };
  }

  // Beyond the default's few n × (p + pv) float64 temporaries: the pilot's kept logits (at most
  // kSkeinformerKeptLogits floats), the pilot's and the selected columns' rows (d_eff × (p + pv), a few
  // copies) and a 256 × d_eff block of logits; rownorm=exact adds a 256 × n block of full rows.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double d_eff = static_cast<double>(params_.sketch_size(n)), rows = static_cast<double>(n);
    double bytes = Estimator::memory_bytes(n, p, pv) + 4.0 * 4.0 * d_eff * (p + pv) + 4.0 * kRowBlock * d_eff;
    if (params_.importance) bytes += 4.0 * std::min(d_eff * rows, static_cast<double>(kSkeinformerKeptLogits));
    if (params_.rownorm == RowNorm::kExact) bytes += 4.0 * kRowBlock * rows;
    return bytes;
  }

  // With a pilot: its exact rows over all keys (d_eff·n logits and P·V), the column norms (the same logits
  // again, unless the pilot's are kept), then every query against the d_eff columns (logits and P·V);
  // uniform columns skip the first two. rownorm=exact adds every query's full row of logits for its
  // denominator.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double d_eff = static_cast<double>(params_.sketch_size(n));
    const double sketch = 2.0 * n * d_eff * (p + pv);
    const double logits_again = params_.keeps_pilot_logits(n) ? 0.0 : 2.0 * n * d_eff * p;
    const double pilot = params_.importance ? sketch + logits_again : 0.0;
    const double exact_denominator = params_.rownorm == RowNorm::kExact ? 2.0 * n * n * p : 0.0;
    return pilot + sketch + exact_denominator;
  }

 private:
  SkeinformerParams params_;
  static constexpr int64_t kRowBlock = 256;  ///< query rows per block: 256 × d floats of logits stay in L2
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<SkeinformerParams>{
    .name = "skeinformer",
    .family = "sketching",
    .summary = "Skeinformer (Alg. 1): pilot rows, column sampling by importance, adaptive row normalisation, "
               "pilot reuse; ablations as options",
    .page = "estimators/sketching.md",
    .params = ParamSet<SkeinformerParams>()
                  .integer("d", &SkeinformerParams::d, 1, 1 << 24,
                           "sketch size: pilot rows and sampled columns (min(d, n-1))")
                  .choice("colsample", &SkeinformerParams::importance, {{"importance", true}, {"uniform", false}},
                          "columns by pilot importance (Alg. 1) or uniform without a pilot (ablation)")
                  .choice("rownorm", &SkeinformerParams::rownorm,
                          {{"adaptive", RowNorm::kAdaptive}, {"simple", RowNorm::kSimple}, {"exact", RowNorm::kExact}},
                          "adaptive (Alg. 1), simple (softmax over sampled columns), exact (O(n^2) denominator)")
                  .integer("pilot_reuse", &SkeinformerParams::pilot_reuse, 0, 1,
                           "1: overwrite the pilot rows with their exact values"),
    .samples_knob = "d",
    .capabilities = {.random = true,
                     .weights = kFullOnly,
                     .rounding = "inputs and output in the precision; the pilot's probabilities from float32; the "
                                 "selected columns attended at FlashAttention-2's points (exponentials and row sums "
                                 "float32, exponentials stored in the precision for their product with the values), "
                                 "the unselected values' sum stored in it; the reused pilot rows at softmax's points"},
    // Observed ≤ 2.1e-7 relative against the CPU version (H100, seed 12345).
    .devices = {{.device = Device::kCuda, .forms = kFullOnly, .tolerance = 1e-4}},
    // The reference code's "w/o row normalization" ablation also skips pilot reuse.
    .ablations = {"skeinformer(pilot_reuse=0)", "skeinformer(rownorm=exact,pilot_reuse=0)"},
    .make = [](const SkeinformerParams& params) { return std::make_unique<Skeinformer>(params); },
});

}  // namespace
}  // namespace attnprobe
