#pragma once
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
// The parameters and sampling steps 1-3 are shared by the CPU version and the CUDA one, so both use
// the same pilot rows and columns.
#include <algorithm>
#include <vector>

#include "attnprobe/common/parallel.h"
#include "attnprobe/rng/random_stream.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

enum class RowNorm { kAdaptive, kSimple, kExact };

/// The most pilot logits (floats: 4 MiB) that skeinformer_sample keeps from the pilot's pass for the column
/// norms (d = 256 up to n = 4096, d = 64 up to 16384); beyond, it forms them again rather than hold d × n.
inline constexpr int64_t kSkeinformerKeptLogits = int64_t{1} << 20;

struct SkeinformerParams {
  int64_t d = 64;                        ///< sketch size (pilot rows and columns: min(d, n − 1))
  bool importance = true;                ///< colsample=importance (else uniform, no pilot)
  RowNorm rownorm = RowNorm::kAdaptive;  ///< adaptive | simple | exact
  bool pilot_reuse = true;               ///< overwrite the pilot rows with their exact values

  /// d_eff = min(d, n − 1) (at least 1): the pilot rows and the sampled columns at length n.
  int64_t sketch_size(int64_t n) const { return std::max<int64_t>(1, std::min(d, n - 1)); }

  /// Whether the column norms at length n read the pilot's kept d_eff × n logits (at most `limit` floats)
  /// rather than form them again: skeinformer_sample decides by it and flops() counts by it.
  bool keeps_pilot_logits(int64_t n, int64_t limit = kSkeinformerKeptLogits) const {
    return sketch_size(n) * n <= limit;
  }

  /// Whether step 6 applies: pilot rows are written back (not with uniform columns or simple rows).
  bool reuses_pilot() const { return importance && pilot_reuse && rownorm != RowNorm::kSimple; }
};

/// Steps 1-3: the pilot rows J (empty for uniform columns), their exact output rows B_J·V
/// (|J| × pv, float32), the column weights p̂_c = ‖B_J[:, c]‖₂·‖v_c‖₂ (empty for uniform columns) and the
/// columns J′ (min(d, n − 1) of them). Cost O(d·n·p) with a pilot, O(d) without; the pilot's passes run on
/// `pool` when given, with the same result. kept_logits: the limit above (a test passes 0 to compare the two
/// ways of forming the norms).
struct SkeinformerSample {
  std::vector<int64_t> pilot;
  MatrixF pilot_out;
  std::vector<double> column_weights;
  std::vector<int64_t> columns;
};
SkeinformerSample skeinformer_sample(const HeadView& view, const RandomKey& key, const SkeinformerParams& params,
                                     ThreadPool* pool = nullptr, int64_t kept_logits = kSkeinformerKeptLogits);

}  // namespace attnprobe
