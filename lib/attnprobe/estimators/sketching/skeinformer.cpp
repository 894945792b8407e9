// skeinformer(d, colsample, rownorm, pilot_reuse) — Skeinformer (Chen et al., "Sketching as a Tool
// for Understanding and Accelerating Self-attention for Long Sequences", NAACL 2022), Algorithm 1,
// with the ablations of its Table 1 (docs/estimators/sketching.md). Target: softmax.
// With B = D⁻¹A, A = exp(s·QKᵀ), and d_eff = min(d, n − 1):
//  1. pilot: d_eff rows J uniformly with replacement; exact rows B_J;
//  2. column probabilities p̂_c ∝ ‖B_J[:, c]‖₂ · ‖v_c‖₂;
//  3. d_eff columns J′ without replacement ∝ p̂ (successive sampling; no importance weights);
//  4. a_ic = exp(s·q_i·k_c) for c ∈ J′ (per-row shift), R′_i = Σ a_ic v_c, S_i = Σ a_ic;
//  5. adaptive row normalisation: g_i = geometric mean of the selected a_ic,
//     out_i = (R′_i + g_i·(Σ_j v_j − Σ_{c∈J′} v_c)) / (S_i + (n − |J′|)·g_i);
//  6. pilot reuse: rows J of the output are the exact rows B_J·V.
// Ablations: colsample=uniform (no pilot, J′ uniform, no pilot reuse); pilot_reuse=0;
// rownorm=simple (softmax over J′ only, no fill, no pilot reuse); rownorm=exact (R′_i / D_ii with the
// exact O(n²) denominator). Biased (a sketch, not an unbiased estimator); cost O(n·d·p) except
// rownorm=exact.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/skeinformer_params.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {

SkeinformerSample skeinformer_sample(const HeadView& view, const RandomKey& key, const SkeinformerParams& params) {
  const int64_t n = view.n();
  const float scale = static_cast<float>(view.scale);
  const int64_t d_eff = std::max<int64_t>(1, std::min(params.d, n - 1));
  SkeinformerSample sample;
  if (!params.importance) {
    sample.columns = sample_uniform_without_replacement(n, d_eff, RandomStream(key, Purpose::kColumnSample));
    return sample;
  }
  const RandomStream rows(key, Purpose::kRowSample);
  for (int64_t s = 0; s < d_eff; ++s)
    sample.pilot.push_back(rows.index(static_cast<uint32_t>(n), static_cast<uint32_t>(s)));
  const MatrixF q_pilot = view.qf(sample.pilot, Eigen::all);
  MatrixF probs = scale * (q_pilot * view.kf.transpose());  // d_eff × n, O(d·n·p)
  for (int64_t r = 0; r < probs.rows(); ++r) {
    probs.row(r).array() = (probs.row(r).array() - probs.row(r).maxCoeff()).exp();
    probs.row(r) /= probs.row(r).sum();
  }
  sample.pilot_out = probs * view.vf;  // exact rows B_J·V
  std::vector<double> weights(n);
  for (int64_t c = 0; c < n; ++c)
    weights[c] = std::sqrt(probs.col(c).cast<double>().squaredNorm()) * view.v.row(c).norm();
  if (std::none_of(weights.begin(), weights.end(), [](double w) { return w > 0; }))
    std::fill(weights.begin(), weights.end(), 1.0);  // V = 0: any columns give the same (zero) output
  sample.columns = sample_without_replacement(weights, d_eff, RandomStream(key, Purpose::kColumnSample));
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
    const SkeinformerSample sample = skeinformer_sample(view, ctx.key, params_);
    const std::vector<int64_t>& columns = sample.columns;

    // Steps 4-5 on the selected columns.
    const MatrixF k_sel = view.kf(columns, Eigen::all), v_sel = view.vf(columns, Eigen::all);
    const int64_t selected = static_cast<int64_t>(columns.size());
    MatrixF logits = scale * (view.qf * k_sel.transpose());  // n × |J′|
    out.resize(n, pv);
    if (params_.rownorm == RowNorm::kExact) {
      // Exact denominator: D_ii = Σ_j exp(s·q_i·k_j − m_i) with m_i the full row max (O(n²p)).
      const int64_t block = 256;
      for (int64_t r0 = 0; r0 < n; r0 += block) {
        const int64_t rows = std::min(block, n - r0);
        const MatrixF full = scale * (view.qf.middleRows(r0, rows) * view.kf.transpose());
        for (int64_t i = 0; i < rows; ++i) {
          const float row_max = full.row(i).maxCoeff();
          const double denominator = (full.row(i).array() - row_max).exp().cast<double>().sum();
          const RowVectorF a = (logits.row(r0 + i).array() - row_max).exp();
          out.row(r0 + i) = (a * v_sel) / static_cast<float>(denominator);
        }
      }
    } else {
      const RowVectorF v_total = view.vf.cast<double>().colwise().sum().cast<float>();
      const RowVectorF v_missing = v_total - v_sel.cast<double>().colwise().sum().cast<float>();
      const float unselected = static_cast<float>(n - selected);
      for (int64_t i = 0; i < n; ++i) {
        const float shift = logits.row(i).maxCoeff();
        const float log_g = logits.row(i).mean() - shift;  // log of the geometric mean of a_ic
        logits.row(i).array() = (logits.row(i).array() - shift).exp();
        const float s_i = logits.row(i).sum();
        const RowVectorF r_i = logits.row(i) * v_sel;
        if (params_.rownorm == RowNorm::kSimple) {
          out.row(i) = r_i / s_i;
        } else {
          const float g = std::exp(log_g);
          out.row(i) = (r_i + g * v_missing) / (s_i + unselected * g);
        }
      }
    }

    // Step 6: pilot reuse (Algorithm 1); not with uniform columns or simple row normalisation.
    if (params_.reuses_pilot())
      for (size_t r = 0; r < sample.pilot.size(); ++r) out.row(sample.pilot[r]) = sample.pilot_out.row(r);
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

 private:
  SkeinformerParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator({
    .name = "skeinformer",
    .family = "sketching",
    .summary = "Skeinformer (Alg. 1): pilot rows, column sampling by importance, adaptive row normalisation, "
               "pilot reuse; ablations as options",
    .params =
        {{"d", ParamKind::kInt, "64", 1, 1 << 24, {}, "sketch size: pilot rows and sampled columns (min(d, n-1))"},
         {"colsample",
          ParamKind::kChoice,
          "importance",
          0,
          0,
          {"importance", "uniform"},
          "columns by pilot importance (Alg. 1) or uniform without a pilot (ablation)"},
         {"rownorm",
          ParamKind::kChoice,
          "adaptive",
          0,
          0,
          {"adaptive", "simple", "exact"},
          "adaptive (Alg. 1), simple (softmax over sampled columns), exact (O(n^2) denominator)"},
         {"pilot_reuse", ParamKind::kInt, "1", 0, 1, {}, "1: overwrite the pilot rows with their exact values"}},
    .samples_knob = "d",
    .random = true,
    .target = nullptr,
    .weights = true,
    // The reference code's "w/o row normalization" ablation also skips pilot reuse.
    .ablations = {"skeinformer(pilot_reuse=0)", "skeinformer(rownorm=exact,pilot_reuse=0)"},
    .make = [](const Spec& spec) { return std::make_unique<Skeinformer>(SkeinformerParams::from_spec(spec)); },
});

}  // namespace
}  // namespace attnprobe
