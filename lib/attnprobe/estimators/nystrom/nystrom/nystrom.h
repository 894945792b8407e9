#pragma once
// nystrom(L, pinv) — Nyströmformer (Xiong et al., AAAI 2021), the shared baseline of the three
// papers (docs/estimators/nystrom.md). Deterministic. Target: softmax.
//   q̄, k̄ = means of L contiguous segments of Q and K (landmarks);
//   K1 = softmax(s·Q k̄ᵀ) (n × L), K2 = softmax(s·q̄ k̄ᵀ) (L × L), K3 = softmax(s·q̄ Kᵀ) (L × n);
//   out = K1 · pinv(K2) · (K3 · V).
// pinv=iterative: 6 Newton–Schulz steps Z ← ¼·Z·(13I − K2Z(15I − K2Z(7I − K2Z))) (the float64 forms
// evaluate them on the spectrum of K2·K2ᵀ, newton_schulz_pinv; the estimate writes them out in float32,
// newton_schulz_f32) from
// Z₀ = K2ᵀ / (max column sum · max row sum) of this slice's K2 (the reference code takes one max over
// the whole batch, a reported bug). pinv=exact: SVD in float64 with a relative singular-value
// cutoff (K2 reaches condition numbers of 1e18 on real dumps). With L = n the landmarks are the
// tokens, K1 = K2 = K3 = B and B·B⁺·B = B: exact (pinv=exact). The estimate is float32 in two
// softmax-attention passes on the exact kernels (K3·V, then K1·(pinv(K2)·K3·V)); K2 is float64 (L × L)
// and its pseudo-inverse the float32 iteration; with pinv=exact everything is float64 (see estimate()).
// reference() and weights() are float64 throughout.
#include <cstdint>

namespace attnprobe {

struct NystromParams {
  int64_t landmarks = 64;   ///< L (segments); L ≥ n is exact with pinv=exact
  bool exact_pinv = false;  ///< pinv=exact: float64 SVD with a relative cutoff (else 6 Newton–Schulz steps)
};

}  // namespace attnprobe
