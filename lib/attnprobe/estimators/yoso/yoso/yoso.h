#pragma once
// yoso(m, tau, hash, norm, input, grad) — YOSO-m, Bernoulli sampling of attention through m LSH
// hashes (Zeng et al., ICML 2021; docs/estimators/yoso.md). Target: yoso-e with the same τ and input.
// input=lift hashes the lifted unit rows in p + 2 dimensions (lsh.h, yoso_inputs). Backward
// (yoso_backward.h): grad=lsh, the m-hash estimate of the paper's lower bound from bucket tables
// (unbiased for it with hash=gauss), or grad=sparse, the colliding pairs with exact weights.
//   Y_i = (1/m)·Σ_f T_f[h_f(q̂_i)],  T_f[c] = Σ_{j: h_f(k̂_j) = c} v_j;  out_i = ℓ2(Y_i) (norm=l2) or Y_i.
// With hash=gauss, P(h_f(q̂) = h_f(k̂)) = (1 − θ/π)^τ, so E[Y] = YOSO-E's W·V: unbiased before the
// normalisation (tested). hash=hadamard collides 1–13% less often and is biased (tested, reported).
// Cost O(n·m·(τ·p + pv)); never n × n: per hash, keys fill 2^τ bucket sums and queries read them.
// A query that collides with no key in any hash gets the zero vector (the metrics count it).
// Causal form (input=l2): the same draws; tables are filled in token order and query i reads them
// right after key i went in (prefix bucket sums), so with hash=gauss it stays unbiased for causal
// yoso-e before the normalisation (tested).
// The parameters are shared by the CPU version and the CUDA one: one decoding, so a key means the
// same on every device.
#include "attnprobe/estimators/yoso/lsh.h"

namespace attnprobe {

struct YosoParams {
  int m = 32;                      ///< number of hashes
  int tau = 8;                     ///< bits per hash
  LshKind hash = LshKind::kGauss;  ///< Gaussian hyperplanes (unbiased) or the fast Hadamard transform
  bool normalize = true;           ///< ℓ2-normalise the output rows (norm=l2)
  bool lift = false;               ///< input=lift: hash the lifted rows in p + 2 dimensions (yoso_inputs in lsh.h)
  bool sparse_gradient = false;    ///< grad=sparse: backward over colliding pairs with exact weights, not tables
};

}  // namespace attnprobe
