#pragma once
// performer(M, ortho) — RFA / Performer positive random features (Choromanski et al., ICLR 2021;
// Peng et al., ICLR 2021; docs/estimators/random-features.md). Target: softmax.
//   φ(x) = M^{-1/2}·[ξ(x, ω_1) … ξ(x, ω_M)],  out_i = φ(q_i)·(Σ_j φ(k_j)ᵀ v_j) / (φ(q_i)·Σ_j φ(k_j)).
// φ(q)·φ(k) is unbiased for exp(s·q·k) (tested); the ratio is consistent, not unbiased. Log space:
// shifts that cancel exactly, no epsilon (the reference implementations add 1e-4 after a global key
// shift, which collapses to uniform attention at ordinary scales). Cost O(n·M·p); never n × n.
// The forward pass (estimate) is float32 and works in blocks of 256 rows, so its memory does not
// grow with n: keys get one shift per feature, the running maximum c_m of their log-features (sums
// already accumulated are rescaled when c_m grows, as in online softmax), and queries carry c_m and
// take out their own row maximum, so every key sum and every query row holds a 1 and the float32
// denominator is ≥ 1 (one shift per slice underflowed it). Key chunks and query blocks run on the
// context's pool; the chunking depends on n only, so every thread count gives the same bits. That
// pass is feature_attention.h's, shared with favorpp.
// Backward of L = ⟨G, out⟩ with the same ω (a_i = query features, N_i = a_i·KV, D_i = a_i·Σ_j φ(k_j)):
//   ∂L/∂a_im = (g_i·kv_m − (g_i·out_i)·ks_m)/D_i,  ∇_q_i = √s·Σ_m a_im·∂L/∂a_im·ω_m,
//   ∇_V = Φ_K·Σ_i (a_i/D_i)ᵀ g_i;  O(n·M·(p + pv)), float64. Causal: the prefix sums S_i, z_i in place of
//   KV and Σ_j φ(k_j), and ∇_V_j = Σ_{i≥j} (φ(q_i)·φ(k_j)/D_i)·g_i, a suffix sum (backward_causal).
// The parameters are shared by the CPU version and the CUDA one.
#include <cstdint>

namespace attnprobe {

struct PerformerParams {
  int64_t features = 64;   ///< M, the number of random features
  bool orthogonal = true;  ///< ortho=1: blocks of p orthonormal directions with chi-distributed norms
};

}  // namespace attnprobe
