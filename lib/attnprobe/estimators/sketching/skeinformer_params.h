#pragma once
// The decoded parameters of skeinformer and its sampling steps (Algorithm 1, steps 1-3), shared by
// the CPU version (skeinformer.cpp) and the CUDA one (gpu/skeinformer.cu), so both use the same
// pilot rows and columns.
#include <algorithm>
#include <vector>

#include "attnprobe/common/parallel.h"
#include "attnprobe/estimators/registry.h"
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

  static SkeinformerParams from_spec(const Spec& spec) {
    const std::string& rn = spec.get_choice("rownorm");
    return {spec.get_int("d"), spec.get_choice("colsample") == "importance",
            rn == "adaptive" ? RowNorm::kAdaptive
            : rn == "simple" ? RowNorm::kSimple
                             : RowNorm::kExact,
            spec.get_int("pilot_reuse") == 1};
  }
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
