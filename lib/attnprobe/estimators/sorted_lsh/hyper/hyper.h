#pragma once
// hyper(m, b, r, order, mask) — HyperAttention (Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh,
// ICLR 2024; reference insuhan/hyper-attn), non-causal forward. Target: softmax.
//  1. sortLSH blocks (sort_lsh.h): exact softmax over the heavy set H_i (the keys in q_i's block);
//  2. t_1..t_m uniform on [0, n) with replacement, shared by all queries (Purpose kColumnSample);
//     R_i = {u : β_K(t_u) ≠ β_Q(i)} (mask=1; mask=0 keeps every u);
//  3. merged by log-sum-exp: L_i = logaddexp(L^B_i, L^R_i + log(n/m)), out_i = c·O^B + (1 − c)·O^R,
//     c = exp(L^B − L_i) — the same as (N̂^B + N̂^R)/(D̂^B + D̂^R), which is how it is evaluated (one
//     shift per row serving both parts).
// Given the hash, D̂_i = e^{L_i} and N̂_i = e^{L_i}·out_i are unbiased for D_i, N_i (uniform
// Horvitz–Thompson on the off-block keys); out_i is a ratio, biased O(1/m). Reference differences:
// the in-block mask exists only in its fp16/bf16 Triton path — its fp32 `exact_attention` ignores it
// and the flash-attn path never builds it, so in-block keys count twice (mask=0 reproduces that); below
// 4096 tokens it silently returns exact attention (never here: every shipped dump would be exact); it
// pads to a multiple of b with zero keys (never here). No causal form in this version.
// Cost O(n·r·p + n log n + n·(b + m)·(p + pv)), memory O(b·(b + m)) per block; float32 except the hash.
#include <cstdint>
#include <vector>

#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/sorted_lsh/sort_lsh.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

struct HyperParams {
  int64_t samples = 64;  ///< m, uniform residual samples (with replacement), shared by all queries
  int64_t block = 64;    ///< b
  int bits = 7;          ///< r
  BucketOrder order = BucketOrder::kGray;
  bool mask = true;  ///< false: in-block samples counted again (the reference's fp32/flash path)
};

/// n × pv estimate in precision S; log_denominator (optional) receives L_i = log D̂_i; `blocks`, when
/// given, replaces the hash drawn from `key` (tests fix the hash and vary the samples); the hashing and the
/// blocks run on `pool` when one is given (the result does not depend on it); `stored` as block_plus_samples'.
template <typename S>
MatrixT<S> hyper_attention(const HyperParams& params, const HeadView& view, RandomKey key,
                           VectorD* log_denominator = nullptr, const SortLshBlocks* blocks = nullptr,
                           ThreadPool* pool = nullptr, Precision stored = Precision::kF32);

}  // namespace attnprobe
