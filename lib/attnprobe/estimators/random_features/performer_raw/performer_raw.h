#pragma once
// performer-raw(M, ortho) — Performer's positive random features without the log-space stabilisation
// (docs/estimators/random-features.md, "performer-raw"; docs/precision.md). Target: softmax.
//   φ(x) = M^{-1/2}·[exp(ω_1·x̃ − ‖x̃‖²/2) … exp(ω_M·x̃ − ‖x̃‖²/2)], x̃ = √s·x, for queries and keys alike,
//   out_i = φ(q_i)·(Σ_j φ(k_j)ᵀ v_j) / (φ(q_i)·Σ_j φ(k_j)),
// the map as the paper writes it and as implementations without shifts compute it. In real arithmetic it is
// `performer` exactly (the shifts cancel in the ratio; with one key, the same draws give the same estimate to
// float32 rounding under the same key, tested); it exists as the unstabilised variant of the precision study: for large
// logits (‖x̃‖ ≳ 6) the exponents fall below f16's smallest subnormal, every feature of a row rounds to 0 and the row is
// 0/0, where `performer`'s shifted features keep a 1 in every row. Same ω as `performer` under the same key
// (draw_omegas); cost O(n·M·p).
#include "attnprobe/estimators/random_features/performer/performer.h"
