#pragma once
// Seeded synthetic dumps with controlled attention sharpness, for tests and demos.
//
// Generator (per layer ℓ and head h; C cluster directions μ_c, unit vectors in R^p):
//   token j of batch item b belongs to cluster c(j) ~ Uniform(C);
//   u_j = ℓ2(μ_c(j) + σ·ε_j/√p),  w_j = ℓ2(μ_c(j) + σ·ε'_j/√p),  ε, ε' ~ N(0, I_p);
//   q_j = a·u_j, k_j = a·w_j with a² = √p / T_ℓ, and scale s = 1/√p, so s·q_i·k_j = u_i·w_j / T_ℓ;
//   v_j = ν_c(j) + 0.5·η_j with ν_c, η_j ~ N(0, I_pv).
// Same-cluster logits are ≈ 1/T and others ≈ 0: a low temperature T gives peaked attention
// (each query attends to its cluster), a high one nearly uniform attention.
// All draws come from Philox keyed by (seed, layer, head), so a file is a pure function of its
// options.
#include <cstdint>
#include <string>
#include <vector>

#include "attnprobe/io/dump_writer.h"

namespace attnprobe {

struct SynthOptions {
  int layers = 2;
  int heads = 2;
  int kv_heads =
      0;  ///< Hkv dividing heads (grouped-query K/V: kv head g holds the K/V of query head g·H/Hkv); 0 = heads
  int batch = 2;
  int64_t tokens = 256;
  int dim = 32;       ///< p
  int value_dim = 0;  ///< pv; 0 means p
  int clusters = 8;
  std::vector<double> temperatures = {0.1, 1.0};  ///< T per layer, cycled
  double spread = 0.5;                            ///< σ, within-cluster noise
  std::vector<int64_t> lengths;                   ///< valid tokens per batch item (writes `lengths`)
  uint64_t seed = 0;
  /// > 0: each layer gives rotary frequencies θ_f = rope_base^(−2f/p) (layer_NN/rope_inv_freq, root attribute
  /// rope_layout = "half"; docs/dumps.md, "Rotary frequencies") for the estimators that read them; the queries and
  /// keys are not rotated by them. 0: none.
  double rope_base = 0;
  /// The type the dump will store: options whose values overflow it (a tiny temperature makes q and k
  /// about sqrt(sqrt(p)/T)) are refused, never written as inf.
  StoredType type = StoredType::kFloat32;
};

/// Throws UsageError naming the option when the options are invalid or the values they give are not
/// finite in `options.type`.
DumpContents make_synthetic_dump(const SynthOptions& options);

}  // namespace attnprobe
