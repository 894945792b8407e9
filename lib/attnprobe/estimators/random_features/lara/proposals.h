#pragma once
// LARA's proposals (Zheng et al., ICML 2022, Eqs. 32–35): their means from the segment landmarks, one
// sample each, and the C × C proposal densities at the samples, shared by the float32 estimate and the
// float64 form (lara.cpp).
#include <cstdint>

#include "attnprobe/common/matrix.h"
#include "attnprobe/estimators/random_features/lara/lara.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

struct LaraProposals {
  MatrixD log_pi;  ///< C × n: log π_cj = log softmax_j(q̄_c·k̃_j) (attn and mixture proposals; else empty)
  MatrixD mu;      ///< C × p: the proposal means
  MatrixD omegas;  ///< C × p: one sample per proposal (μ_c itself with mode=mean)
  MatrixD log_q;   ///< C × C: log q_c′(ω_c), q_c′ = N(μ_c′, I) whatever the noise
};

/// The proposals of `params`, their samples (noise with std draw_sigma in the scaled space; Purpose::kNoise,
/// and kComponent for the mixture's component) and log q_c′(ω_c). q_bar, k_bar: C × p landmarks, k: keys × p
/// (all in the scaled space; k may be empty for the segment and mixed proposals, which do not read it).
LaraProposals lara_proposals(const LaraParams& params, const MatrixD& q_bar, const MatrixD& k_bar, const MatrixD& k,
                             int64_t n, int64_t p, double draw_sigma, RandomKey key);

}  // namespace attnprobe
