#pragma once
// The locality-sensitive hashes of YOSO (docs/estimators/yoso.md), shared by the `yoso`
// estimator, its tests and (later) the GPU backend, which must produce the identical codes.
//
// A code h_f(x) ∈ [0, 2^τ) has bit b = [r_{f,b}·x > 0] (a projection of exactly 0 gives bit 0).
//  - gauss:    r_{f,b} iid N(0, I_p), row f·τ + b of one (m·τ × p) matrix drawn from the keyed
//              stream; P(h_f(x) = h_f(y)) = (1 − θ/π)^τ exactly.
//  - hadamard: per part t, y_t = H·D3_t·H·D2_t·H·D1_t·x with H the unnormalised Walsh–Hadamard
//              matrix (Sylvester order) and D random ±1 diagonals; hash f = t·k + j, k = ⌊p'/τ⌋,
//              reads coordinates j·τ … j·τ+τ−1 of y_t. x is zero-padded to p' = 2^⌈log2 p⌉.
// Projections are computed in float64 so that the CPU and the GPU agree on every sign.
#include <cstdint>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/estimators/yoso/walsh_hadamard.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

enum class LshKind { kGauss, kHadamard };

/// codes[i·m + f] = h_f(x_i) for the rows x_i of `x` (n × p, already ℓ2-normalised or not: the
/// sign of a projection does not depend on the norm). The hash functions depend only on
/// (key, m, tau, kind, p), so queries and keys hashed with the same arguments share them.
/// Throws InputError when tau > p' for hadamard, or tau outside 1..30.
/// With a pool, blocks of rows (gauss) or rows (hadamard) are spread over its threads; each row's
/// codes depend on that row and the draws alone, so every thread count gives the same codes.
std::vector<uint32_t> lsh_codes(const MatrixD& x, int m, int tau, LshKind kind, RandomKey key,
                                ThreadPool* pool = nullptr);

/// The ±1 diagonal entry d ∈ {0, 1, 2} (D1, D2, D3) of part t at coordinate c: +1 or −1.
int hadamard_sign(const RandomStream& stream, uint32_t part, uint32_t d, uint32_t c);

/// ℓ2-normalised rows; a zero row stays zero.
MatrixD normalize_rows(const MatrixD& x);

/// YOSO's inputs q̂ (n × p′) and k̂ (keys × p′) from q (n × p) and k (keys × p):
///  - lift = false (input=l2): ℓ2-normalised rows, p′ = p;
///  - lift = true (input=lift, YOSO appendix §1.1 after Neyshabur & Srebro): with M the largest row
///    norm of q and k together, q̂_i = [q_i, √(M² − ‖q_i‖²), 0]/M and k̂_j = [k_j, 0, √(M² − ‖k_j‖²)]/M,
///    p′ = p + 2: unit rows with q̂_i·k̂_j = q_i·k_j/M², so the collision probability is monotone in the
///    raw inner product. (M² − ‖x‖² is clamped at 0 against rounding; an all-zero slice gives zero rows.)
void yoso_inputs(const MatrixD& q, const MatrixD& k, bool lift, MatrixD& q_hat, MatrixD& k_hat);

}  // namespace attnprobe
