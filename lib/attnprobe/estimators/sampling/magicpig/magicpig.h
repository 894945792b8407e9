#pragma once
// magicpig(K, L, sink, window, min, floor, anchor, center, tables) — MagicPIG: LSH sampling with importance weights
// (docs/estimators/sampling_decode.md). Target: softmax.
// Row t at position t splits the keys it sees into an exact part E_t (w = 1) and a hashed part H_t:
//   anchor=prefill (the reference): E_t = [0, sink) ∪ [P − window + 1, t], H = [sink, P − window + 1), fixed for
//     every row (P = the first evaluated row's position: the prompt ends there);
//   anchor=row: E_t = [0, sink) ∪ [t − window + 1, t], H_t = [sink, t − window + 1) (tables of the row's own past);
//   anchor=auto: prefill when P > 0, else row.  Under the full mask sink = window = 0: every key is hashed.
// Keys are centred, x_j = k_j − c with c the mean of the hashed keys (center=0: c = 0); the softmax is unchanged
// (every logit moves by s·q·c). SimHash: K·L Gaussian hyperplanes g_f (f = l·K + b, yoso's gauss hash functions:
// normal row f of Purpose::kHashProjection, element d = coordinate), code_l(x) = Σ_{b<K} [x·g_{lK+b} > 0]·2^b, the
// query not centred. Collisions c_j = #{l : code_l(q_t) = code_l(x_j)}; S_t = {j ∈ H_t : c_j ≥ min}.
// Inclusion probability, in closed form: cos θ_j = q_t·x_j / (‖q_t‖‖x_j‖) (θ = π/2 for a zero vector),
// p_j = (1 − θ_j/π)^K, π_j = P(Binomial(L, p_j) ≥ min) (stable forms: magicpig_inclusion). Weights
// ω_j = −log(π_j + floor) on S_t, one softmax over E_t ∪ S_t. floor = 0: Horvitz–Thompson, E[N̂] = N and E[D̂] = D
// over the hyperplanes (the bits are independent given q and x); floor = 1e-4 (the reference):
// E[D̂] = Σ_E e^ℓ + Σ_H e^{ℓ_j}·π_j/(π_j + floor). The ratio ô is biased, O(1/E|S_t|).
// tables=group: the hyperplanes are drawn with the kv group's key (ctx.shared_key()), so every query head of a kv
// group probes the same tables, as the reference; tables=head: with the head's own key.
// The signs come from float64 projections: the keys' projections g·k_j once per call, and g·x_j = g·k_j − g·c, so
// anchor=row's moving centre costs a subtraction per bit, not a rehash (yoso's lsh_codes hashes given rows, in
// float32 with a float64 fallback near 0; the hash functions and the bit order are the same).
// Random; a row reads its own query and keys ≤ t only (anchor=prefill: keys < P for its tables).
// Cost: |H|·K·L·p hashing once per call (anchor=row with center=1: up to K·L·|H_t| sign tests per row, most skipped:
// select_moving_rows), K·L·p per query, L·|H_t| code comparisons, |E_t ∪ S_t|·(p + pv) attention.
#include <cstdint>

namespace attnprobe {

enum class MagicpigAnchor { kAuto, kPrefill, kRow };
enum class MagicpigTables { kGroup, kHead };

struct MagicpigParams {
  int64_t K = 10;       ///< bits per table
  int64_t L = 150;      ///< tables
  int64_t sink = 4;     ///< the first keys, exact
  int64_t window = 65;  ///< the last keys up to the query's own (the reference's 64 local tokens + the query's)
  int64_t min = 2;      ///< collisions that select a key (the reference records a key at its second)
  double floor = 1e-4;  ///< added to π_j in the weight (0: Horvitz–Thompson)
  MagicpigAnchor anchor = MagicpigAnchor::kAuto;
  int64_t center = 1;  ///< centre the hashed keys on their mean
  MagicpigTables tables = MagicpigTables::kGroup;
};

/// (1 − θ/π)^K with cos θ = `cosine` clamped to [−1, 1]: the probability that K Gaussian hyperplanes put two
/// vectors at angle θ on the same sides.
double simhash_collision(double cosine, int64_t K);

/// π = P(Binomial(L, p) ≥ min) without cancellation: min = 1: −expm1(L·log1p(−p)); min = 2:
/// −expm1((L − 1)·log1p(−p) + log1p((L − 1)·p)) for L·p ≥ 0.01 (below, where its two logs cancel, the series); min ≥ 3
/// and small p: the binomial tail summed from the small side (the upper terms from pmf(min) when L·p < min, else
/// 1 − the lower terms).
double magicpig_inclusion(double p, int64_t L, int64_t min);

}  // namespace attnprobe
