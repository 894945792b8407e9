#pragma once
// Positive random features and the per-ω key–value average shared by Performer, RA and LARA
// (docs/estimators/random-features.md). Notation: x̃ = √s·x, so
// q̃·k̃ = s·q·k;  ξ(x, ω) = exp(ω·x̃ − ‖x̃‖²/2), with E_ω~N(0,I)[ξ(q, ω)·ξ(k, ω)] = exp(q̃·k̃);
// f(ω) = Σ_j softmax_j(ω·k̃_j − ‖k̃_j‖²/2)·v_j (ξ(q, ω) cancels out of the ratio).
// Everything here is float64 and in log space: a shift that cancels exactly replaces any epsilon.
#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/rounding.h"
#include "attnprobe/rng/random_matrix.h"

namespace attnprobe {

/// ω_1..ω_M as rows (M × p): iid N(0, I_p), or (ortho) blocks of p orthonormal directions, each
/// scaled by the norm of an independent N(0, I_p) vector, so every ω is still marginally N(0, I_p).
/// Draws: row r of the Gaussian block from stream (kFeature) row r; norms from (kFeatureNorm). With a
/// pool the orthogonal blocks are drawn on it (the same bits).
MatrixD draw_omegas(int64_t count, int64_t p, bool orthogonal, RandomKey key, ThreadPool* pool = nullptr);

/// The rows of `block` (rows ≤ p) orthonormalised in order, as Gram–Schmidt would: block = L·Q with L
/// lower triangular with a positive diagonal, Q returned (the orthogonal draws of draw_omegas; Haar for
/// a Gaussian block). Cholesky QR twice (block·blockᵀ = L·Lᵀ, Q = L⁻¹·block, and again on that Q):
/// products and triangular solves. draw_omegas(256, 64) took 0.65 ms with Householder QR on the
/// row-major block (Eigen's blocked reflectors, most of a performer(M=256) call's setup), 0.51–0.62 ms
/// on a column-major copy, 0.40 ms this way (one Zen 4 core, min of 200). The second pass takes the
/// first's orthogonality error (∝ cond(block)²·ε) down to rounding. When the first pass leaves rows
/// farther than 0.1 from orthonormal, or the Gram matrix is not numerically positive definite (possible
/// once cond(block)² nears 1/ε; a Gaussian 64 × 64 block passes cond 1e7 with probability ~1e-5),
/// Householder QR does it instead. Both give the same Q up to rounding (tested, also on a singular block).
MatrixD orthonormal_rows(const MatrixD& block);

/// log ξ(x_i, ω_m) = ω_m·x̃_i − ‖x̃_i‖²/2 for rows x̃_i of `x_scaled` (n × M).
MatrixD log_features(const MatrixD& x_scaled, const MatrixD& omegas);

/// The prefix sums of the causal forms with positive features (performer, scatterbrain): kv = Σ_{j≤i}
/// φ̃(k_j)v_jᵀ (M × pv) and z = Σ_{j≤i} φ̃(k_j), one key at a time in float64, with φ̃_f(k_j) =
/// exp(log φ_f(k_j) − c_f) under each feature's running maximum c_f (`shift`) of the keys added so far:
/// the sums are rescaled when it grows, so every prefix holds a 1 and cannot underflow, and nothing a
/// later key brings touches an earlier row's.
/// `stored` below float32 (--precision bf16|f16) is the recurrent form's state kept in the dtype between tokens,
/// as a decode cache keeps it: each key's features φ̃ are stored in the precision before they are added, and after
/// every key (its rescale and its addition computed wider) each element of kv and z is stored through float32 into
/// the precision. A bf16 sum then stops growing once it is 2^8 times the features added to it
/// (kRecurrentStateRounding).
struct CausalFeatureSums {
  CausalFeatureSums(int64_t features, int64_t pv, Precision stored = Precision::kF32);
  /// Adds key j: its log-features log φ(k_j) (1 × M) and its value v_j (1 × pv).
  void add(const Eigen::Ref<const RowVectorD>& log_key, const Eigen::Ref<const RowVectorD>& value);
  RowVectorD shift, z;  ///< c (−∞ before the first key) and Σ φ̃
  MatrixD kv;           ///< Σ φ̃·vᵀ
  Precision stored;     ///< the state's precision (f32: float64 sums, nothing rounded)
};

/// The rounding points of CausalFeatureSums' state below float32, as the causal forms that use it declare them.
inline constexpr const char* kRecurrentStateRounding =
    "each key's features exp(·) (shifted by the running maximum, so ≤ 1) and, after every key, the prefix state "
    "Σφ(k)vᵀ and Σφ(k) stored in the precision (the recurrent state a decode cache keeps), the query's features "
    "stored in it, their products with the state accumulated float32, output rounded";

/// Row r of the result is f(ω_r) (rows × pv), and log_sum[r] = log Σ_j ξ(k_j, ω_r). O(rows·n·p).
MatrixD key_value_average(const MatrixD& omegas, const MatrixD& k_scaled, const MatrixD& v, VectorD* log_sum = nullptr);

}  // namespace attnprobe
