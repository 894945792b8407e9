#pragma once
// linformer-jlt(d) — the unreduced Johnson–Lindenstrauss sketch behind Linformer (the Skeinformer paper
// §3.3.2; docs/estimators/sketching.md). Target: softmax.
//   out = B·S·Sᵀ·V with S ∈ R^{n×d}, S_ij iid N(0, 1/d) (gaussian_projection.h), so E[SSᵀ] = I and the
//   estimate is unbiased for B·V = softmax(s·QKᵀ)·V. O(n²): it shows what Linformer gave up.
#include <cmath>
#include <cstdint>

namespace attnprobe {

struct LinformerJltParams {
  int64_t d = 64;  ///< sketch width

  double stddev() const { return 1.0 / std::sqrt(static_cast<double>(d)); }
};

}  // namespace attnprobe
