#pragma once
// Positive random features and the per-ω key–value average shared by Performer, RA and LARA
// (docs/estimators/random-features.md). Notation: x̃ = √s·x, so
// q̃·k̃ = s·q·k;  ξ(x, ω) = exp(ω·x̃ − ‖x̃‖²/2), with E_ω~N(0,I)[ξ(q, ω)·ξ(k, ω)] = exp(q̃·k̃);
// f(ω) = Σ_j softmax_j(ω·k̃_j − ‖k̃_j‖²/2)·v_j (ξ(q, ω) cancels out of the ratio).
// Everything here is float64 and in log space: a shift that cancels exactly replaces any epsilon.
#include "attnprobe/common/matrix.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

/// ω_1..ω_M as rows (M × p): iid N(0, I_p), or (ortho) blocks of p orthonormal directions, each
/// scaled by the norm of an independent N(0, I_p) vector, so every ω is still marginally N(0, I_p).
/// Draws: row r of the Gaussian block from stream (kFeature) row r; norms from (kFeatureNorm).
MatrixD draw_omegas(int64_t count, int64_t p, bool orthogonal, RandomKey key);

/// log ξ(x_i, ω_m) = ω_m·x̃_i − ‖x̃_i‖²/2 for rows x̃_i of `x_scaled` (n × M).
MatrixD log_features(const MatrixD& x_scaled, const MatrixD& omegas);

/// Row r of the result is f(ω_r) (rows × pv), and log_sum[r] = log Σ_j ξ(k_j, ω_r). O(rows·n·p).
MatrixD key_value_average(const MatrixD& omegas, const MatrixD& k_scaled, const MatrixD& v, VectorD* log_sum = nullptr);

}  // namespace attnprobe
