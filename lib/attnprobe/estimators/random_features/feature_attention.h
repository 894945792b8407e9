#pragma once
// The float32 forward pass of positive random features, shared by performer and favorpp (and any map of
// the form below): out_i = φ(q_i)·Σ_j φ(k_j)ᵀv_j / φ(q_i)·Σ_j φ(k_j), computed in row blocks so memory
// does not grow with n (never n × M), on the pool, with the same bits for any thread count.
//   log φ_m(q) = q·w_m^Q + c_m (+ a per-row constant, which cancels),
//   log φ_m(k) = k·w_m^K + c_m − Σ_l h_l·k_l²
// (√s and any per-coordinate rescale folded into w; Performer: w^Q = w^K = √s·ω, c = 0, h = s/2).
// Stabilisation (docs/estimators/random-features.md): keys get one shift per feature, the running maximum
// of their log-features (sums already accumulated are rescaled when it grows, as in online softmax); the
// queries carry it and take out their own row maximum, so every key sum and every query row holds a 1
// and the float32 denominator is ≥ 1.
#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/rounding.h"

namespace attnprobe {

struct PositiveFeatureMapF {
  MatrixF query_t;                ///< p × M: w^Q as columns (the tile kernel's layout)
  MatrixF key_t;                  ///< p × M: w^K as columns
  RowVectorF offsets;             ///< M: c_m (empty: none)
  RowVectorF key_square_weights;  ///< p: h_l (empty: `key_square_weight` for every coordinate)
  float key_square_weight = 0;    ///< h when it is one number (Performer's s/2): h·‖k‖²
  /// false: no stabilising shifts — the textbook map, log φ(q) = q·w^Q + c_m − h·‖q‖² as the keys' (h one number),
  /// exponentiated as it stands (performer-raw, the precision study's unstabilised variant: its features
  /// underflow f16 for large logits). Exact in real arithmetic either way: the shifts cancel in the ratio.
  bool shifted = true;
};

/// out (resized to n × pv) for queries q (n × p), keys k (keys × p), values v (keys × pv). Query row i is at
/// position first_position + i (self-attention: 0): rows are blocked by absolute position, so the last rows
/// of a slice evaluated alone get the very bits of the whole slice's (a decode step).
/// `stored` below float32 (--precision bf16|f16) rounds what a GPU kernel stores between its steps: each
/// block's key features exp(·) before their products, the key state Σ_j φ(k_j)ᵀv_j and Σ_j φ(k_j) once reduced,
/// and the query features; the products and sums accumulate in float32 (here: wider) — kRandomFeatureRounding.
void positive_feature_attention(const PositiveFeatureMapF& map, const MatrixF& q, const MatrixF& k, const MatrixF& v,
                                ThreadPool* pool, MatrixF& out, int64_t first_position = 0,
                                Precision stored = Precision::kF32);

/// The rounding points of positive_feature_attention below float32, as estimators that use it declare them.
inline constexpr const char* kRandomFeatureRounding =
    "features exp(·) (shifted per feature, so ≤ 1) stored in the precision, key state Σφ(k)vᵀ and Σφ(k) stored in "
    "it once reduced, products and sums accumulated float32, output rounded";

/// Bytes positive_feature_attention holds beyond its inputs and output, for M features and pv columns.
double positive_feature_attention_bytes(int64_t features, int64_t p, int64_t pv);

}  // namespace attnprobe
