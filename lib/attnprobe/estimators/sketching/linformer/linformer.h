#pragma once
// linformer(d, std) — low-rank projections (Wang et al., "Linformer", 2020; the Skeinformer paper
// §3.3.2; docs/estimators/sketching.md). Target: softmax.
//   E ∈ R^{d×n}, E_ij iid N(0, std²) (std = 0 means 1/√d, the JL scaling; the reference code's unscaled
//   0.02 is std=0.02); out = softmax(s·Q(EK)ᵀ)·(EV). O(n·d·p). Biased: the projection sits inside the
//   softmax. E is never formed: EK and EV are accumulated over tiles of E (30 rows × 256 columns, 30 KiB)
//   drawn as they are used (gaussian_projection.h), a group of E's rows per work item on the call's pool,
//   so memory is O(d·p) beside the inputs and the bits do not depend on the thread count.
#include <cmath>
#include <cstdint>

namespace attnprobe {

struct LinformerParams {
  int64_t d = 64;     ///< projected length
  double stddev = 0;  ///< std of E's entries; 0 means 1/√d

  /// The std actually used: stddev, or 1/√d when it is 0.
  double effective_stddev() const { return stddev > 0 ? stddev : 1.0 / std::sqrt(static_cast<double>(d)); }
};

}  // namespace attnprobe
