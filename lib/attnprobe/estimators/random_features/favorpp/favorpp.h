#pragma once
// favorpp(M, ortho, a, variant, arf_ref, s) — FAVOR++: Performer with CRT's optimal positive random
// features (Likhosherstov et al., "Chefs' Random Tables", NeurIPS 2022; reference: google-research
// `expplus`, tensorflow/models `expplus`), and the FAVOR# variants `arf`/`sderf` (arXiv 2302.00787,
// google-research `exparf`/`expsharp`). Target: softmax.
//   φ_m(x) = M^{-1/2}·D·exp(A‖ω_m‖² + B·ω_m·x̃ − ‖x̃‖²/2)   (gerf.h),
//   out_i = φ(q_i)·Σ_j φ(k_j)v_jᵀ / φ(q_i)·Σ_j φ(k_j),
// A = A* = (1 − 2z/p − √((2z/p + 1)² + 8z/p))/16 with z the mean of ‖q̃_i + k̃_j‖² over all pairs
// (one A for queries and keys), or a given number; A = 0 is exactly `performer`'s features.
// Numerator and denominator unbiased (for any fixed A); the ratio is consistent, biased O(1/M).
// Differences from the reference code, by choice: no 1e-6 after the stabiliser (log-space shifts that
// cancel instead: one per key feature, carried by the queries, and one per query row); q, k scaled once by √s
// (tensorflow's wrapper scales twice and estimates softmax(QKᵀ/p)); ARF's G_l is the variance-reducing one
// (`arf_ref=1` mimics `exparf`); SDERF fits P on the scaled data and keeps D (it cancels anyway).
// s = −1: CRT's trigonometric branch, [cos(βω·x̃), sin(βω·x̃)]·D·e^{Aω² + ‖x̃‖²/2}, β = √(1 − 4A): not
// positive, so denominators can be ≤ 0 (shown only to make the point). A* needs all query–key pairs,
// so there is no causal form. Cost O(n·M·(p + pv)) + O(n·p) for A* (+ O(n·p² + p³) for sderf);
// float32 products, the fit (A*, G, eigendecomposition) in float64 because it is O(n·p) and sets one
// number shared by every feature. The estimate of a positive map is Performer's blocked float32 pass
// (feature_attention.h: row blocks on the pool, never n × M).
#include <cstdint>

#include "attnprobe/common/rounding.h"

#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/random_features/gerf.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

struct FavorppParams {
  int64_t features = 64;  ///< M
  bool orthogonal = true;
  GerfOptions gerf;
};

/// The n × pv estimate in precision S (float: the registered estimator; double: tests). `map`, when
/// given, receives the fitted feature map. `stored` below float32 (S = float only) rounds what a GPU kernel stores
/// between its steps: the query and key features, the key state Σφ(k)vᵀ and Σφ(k) once reduced, and the
/// numerator and denominator; the products accumulate in float32 (kFavorppRounding's trigonometric part).
template <typename S>
MatrixT<S> favorpp_attention(const FavorppParams& params, const HeadView& view, RandomKey key, GerfMap* map = nullptr,
                             Precision stored = Precision::kF32);

}  // namespace attnprobe
