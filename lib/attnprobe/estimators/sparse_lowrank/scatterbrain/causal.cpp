// scatterbrain's causal form (scatterbrain.h): supports fixed by position, Performer's causal prefix sums
// off them, one token at a time in float64.
#include <algorithm>
#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/random_features/feature_attention.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/sparse_lowrank/scatterbrain/scatterbrain.h"

namespace attnprobe {

bool scatterbrain_has_causal_form(const ScatterbrainParams& params) {
  return (params.sparse == SbSupport::kLocal || params.sparse == SbSupport::kBlock) && params.kind != SbFeatures::kOprf;
}

// Row i: N̂_i = Σ_{j∈W_i} e_ij·v_j + Σ_{j≤i} ê_ij·v_j − Σ_{j∈W_i} ê_ij·v_j over the window W_i = S_i ∩ [0, i],
// D̂_i likewise with the complement clamped at 0 — the full form's row i on the prefix 0..i. The prefix
// sums are causal performer's (CausalFeatureSums: φ̃_f(k_j) = exp(log φ_f(k_j) − c_f) under the running
// maximum c_f of the keys so far). Query i's features weigh feature f by g_f = exp(log φ_f(q_i) + c_f − a_i),
// so ê_ij·e^{−a_i} = Σ_f g_f·φ̃_f(k_j), with one row shift a_i = max(max_f(log φ_f(q_i) + c_f), max_{W_i}
// s·q_i·k_j) that bounds every term by 1. Log-features are formed per block of 256 rows, for the block's
// keys and the earlier ones its windows reach back to.
MatrixD scatterbrain_causal_attention(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                      VectorD* log_denominator, Precision stored) {
  require_usage(scatterbrain_has_causal_form(params),
                "scatterbrain has a causal form for sparse=local|block with features=hyp|pos only");
  const int64_t n = view.n(), pv = view.pv(), w = params.width;
  const GerfMap map = scatterbrain_features(params, view, key);
  const int64_t m = map.projections.rows();
  // The first key of row i's window (i + 1: empty).
  auto window_begin = [&](int64_t i) -> int64_t {
    if (w == 0) return i + 1;
    const int64_t begin = params.sparse == SbSupport::kLocal ? i - w / 2 : (i / w) * w - params.ext;
    return std::max<int64_t>(0, begin);
  };
  constexpr int64_t kRows = 256;
  CausalFeatureSums sums(m, pv, stored);
  MatrixD out(n, pv);
  if (log_denominator) log_denominator->resize(n);
  for (int64_t r0 = 0; r0 < n; r0 += kRows) {
    const int64_t rows = std::min(kRows, n - r0);
    // The block's keys from the first one its windows reach (window starts do not decrease with i; an
    // empty window starts after its row, so the block's own keys are always included).
    const int64_t k0 = std::min(r0, window_begin(r0));
    const MatrixD log_q = gerf_log_features<double>(map, MatrixD(view.q.middleRows(r0, rows)), view.scale, true);
    const MatrixD log_k =
        gerf_log_features<double>(map, MatrixD(view.k.middleRows(k0, r0 + rows - k0)), view.scale, false);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r0 + r;
      sums.add(log_k.row(i - k0), view.v.row(i));
      const int64_t begin = window_begin(i), width = i + 1 - begin;
      RowVectorD g = log_q.row(r) + sums.shift;
      double top = g.maxCoeff();
      VectorD logits;
      if (width > 0) {
        logits = view.scale * (view.k.middleRows(begin, width) * view.q.row(i).transpose());
        top = std::max(top, logits.maxCoeff());
      }
      g = (g.array() - top).exp();
      store_below_float32(g, stored);  // what a decode kernel stores before its product with the state
      RowVectorD num = g * sums.kv;
      double den_exact = 0, den_features = g.dot(sums.z);
      if (width > 0) {
        VectorD exact = (logits.array() - top).exp();
        // ê_ij·e^{−a_i} = Σ_f g_f·φ̃_f(k_j) for the window's keys.
        const MatrixD key_features =
            (log_k.middleRows(begin - k0, width).rowwise() - sums.shift).array().exp().matrix();  // width × M
        VectorD features = key_features * g.transpose();
        den_exact = exact.sum();
        den_features -= features.sum();
        store_below_float32(exact, stored);  // after their sums, before their products with V
        store_below_float32(features, stored);
        num += (exact - features).transpose() * view.v.middleRows(begin, width);
      }
      const double den = den_exact + std::max(0.0, den_features);
      out.row(i) = num / den;
      if (log_denominator) (*log_denominator)(i) = top + std::log(den);
    }
  }
  return out;
}

}  // namespace attnprobe
