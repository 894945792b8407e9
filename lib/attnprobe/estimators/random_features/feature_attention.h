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

namespace attnprobe {

struct PositiveFeatureMapF {
  MatrixF query_t;                ///< p × M: w^Q as columns (the tile kernel's layout)
  MatrixF key_t;                  ///< p × M: w^K as columns
  RowVectorF offsets;             ///< M: c_m (empty: none)
  RowVectorF key_square_weights;  ///< p: h_l (empty: `key_square_weight` for every coordinate)
  float key_square_weight = 0;    ///< h when it is one number (Performer's s/2): h·‖k‖²
};

/// out (resized to n × pv) for queries q (n × p), keys k (keys × p), values v (keys × pv). Query row i is at
/// position first_position + i (self-attention: 0): rows are blocked by absolute position, so the last rows
/// of a slice evaluated alone get the very bits of the whole slice's (a decode step).
void positive_feature_attention(const PositiveFeatureMapF& map, const MatrixF& q, const MatrixF& k, const MatrixF& v,
                                ThreadPool* pool, MatrixF& out, int64_t first_position = 0);

/// Bytes positive_feature_attention holds beyond its inputs and output, for M features and pv columns.
double positive_feature_attention_bytes(int64_t features, int64_t p, int64_t pv);

}  // namespace attnprobe
