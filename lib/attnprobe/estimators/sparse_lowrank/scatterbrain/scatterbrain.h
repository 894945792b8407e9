#pragma once
// scatterbrain(M, sparse, w, ext, rounds, features, ortho) — Scatterbrain (Chen, Dao, Winsor, Song,
// Rudra, Ré, NeurIPS 2021; reference HazyResearch/fly SBLocal/SBSmyrf, re-implemented in
// HKUNLP/efficient-attention). Target: softmax. Exact on a sparse support S_i, random features off it:
//   N̂_i = Σ_{j∈S_i} e_ij·v_j + Σ_{j∉S_i} ê_ij·v_j,  D̂_i = Σ_{j∈S_i} e_ij + Σ_{j∉S_i} ê_ij,  out_i = N̂_i / D̂_i,
// e_ij = exp(s·q_i·k_j), ê_ij = φ(q_i)·φ(k_j). The complement is evaluated as global minus support,
// φ(q_i)·(Σ_j φ(k_j)v_jᵀ) − Σ_{j∈S_i} ê_ij·v_j (fly's form), with one shift per row shared by both parts:
// a_i = max(c_i, max_{j∈S_i} s·q_i·k_j), with φ(q_i)·φ(k_j) = e^{c_i}·φ̃(q_i)·φ̃(k_j) under one shift per key
// feature carried by the queries (gerf.h, exponentiate_features).
// Supports: local (fly SBLocal's window j ∈ [i − ⌊w/2⌋, i + ⌈w/2⌉ − 1]), block (query blocks of w, keys
// extended by ext each side), sortlsh (the sortLSH blocks with b = w, r = 7, Gray order), smyrf (per round
// an XBOX+ lift, one Gaussian projection, sort, clusters of w; the union over rounds). Features: hyp (fly:
// ⌊M/2⌋ ω with ξ(x, ±ω)), pos (`performer`'s), oprf (`favorpp`'s A*). For a fixed support E[N̂_i] = N_i and
// E[D̂_i] = D_i; every entry of the implied matrix is exact on S and Performer's off it; the ratio is
// biased. Only the denominator complement is clamped at 0 (it is ≥ 0 up to rounding for positive
// features); no epsilon. Reference differences: efficient-attention's complement uses log(e^a − e^b +
// 1e-5) and a 1e-3 clamp (biased when the complement is small); fly's LRA configs set softmax_eps 1e-4;
// smyrf pads to a multiple of w (here the last cluster is shorter); fly's E2LSH bucket width and shift
// do not change the sort (not drawn here).
// Causal form (sparse=local|block, features=hyp|pos; scatterbrain_causal_attention): S_i ∩ [0, i] exact,
// the features on the rest of the prefix, as Performer's causal prefix sums with running per-feature
// shifts, one token at a time in float64.
// Evaluation: queries in chunks of ≤ 64 that share their candidate keys (consecutive queries for local/block,
// one sortLSH block or SMYRF cluster per round), so exact logits and feature products on the support are
// two small matrix products per chunk; one shift per row is kept online across rounds.
// Precision: features, exact logits and the per-chunk products in S; Σ_j φ(k_j)v_jᵀ, the per-row sums
// across chunks and the global − support difference in float64, because the difference cancels when S
// holds most of φ's mass.
// Cost O(n·M·(p + pv) + n·|S|·(p + M + pv)) plus O(n·p·rounds + n log n) for hashed supports.
#include <cstdint>
#include <vector>

#include "attnprobe/common/rounding.h"
#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/common/sparse_support.h"
#include "attnprobe/estimators/random_features/gerf.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

enum class SbSupport { kLocal, kBlock, kSortLsh, kSmyrf };
enum class SbFeatures { kHyp, kPos, kOprf };

struct ScatterbrainParams {
  int64_t features = 64;  ///< M (hyp uses ⌊M/2⌋ pairs ±ω)
  SbSupport sparse = SbSupport::kLocal;
  int64_t width = 32;  ///< w: window, block, LSH block or cluster size; 0 = empty support
  int64_t ext = 0;     ///< block: keys of the block extended by ext each side
  int rounds = 2;      ///< smyrf: hashing rounds
  SbFeatures kind = SbFeatures::kHyp;
  bool orthogonal = true;
};

/// Hashed supports as groupings: for round h, query i and key j meet iff query_group[h][i] == key_group[h][j]
/// (sortlsh: one round, the sortLSH blocks; smyrf: `rounds` rounds of XBOX+ clusters, from `key`).
struct ScatterbrainGroupings {
  std::vector<std::vector<int64_t>> query_group, key_group;
};
ScatterbrainGroupings scatterbrain_groupings(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                             ThreadPool* pool = nullptr);

/// The support of `params` on a slice (hash from `key` for sortlsh/smyrf).
SparseSupport scatterbrain_support(const ScatterbrainParams& params, const HeadView& view, RandomKey key);

/// The feature map of `params` fitted to the slice (the same draws the estimator uses).
GerfMap scatterbrain_features(const ScatterbrainParams& params, const HeadView& view, RandomKey key);

/// Whether `params` has a causal form: a support fixed by positions (local, block) and features drawn
/// from the key alone (hyp, pos). sortlsh and smyrf sort all queries and keys, so a later token moves
/// an earlier query's bucket; oprf fits A* to all query–key pairs.
bool scatterbrain_has_causal_form(const ScatterbrainParams& params);

/// The causal form (mask = causal) of such params: row i from keys j ≤ i only, S_i ∩ [0, i] exact and
/// Performer features on the rest of the prefix, one token at a time in float64; log_denominator as below.
/// Row i equals the full form's last row on the prefix 0..i with the same key. `stored` below float32: the prefix
/// state is kept in the precision after every key (CausalFeatureSums), and the query's feature weights and the
/// window's exponentials and feature products are stored for their products with V (kScatterbrainRounding).
MatrixD scatterbrain_causal_attention(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                      VectorD* log_denominator = nullptr, Precision stored = Precision::kF32);

/// n × pv estimate in precision S; log_denominator (optional) receives log D̂_i (float64). The features
/// and the query chunks run on the pool when one is given (all supports but multi-round smyrf, whose
/// rounds merge into shared sums); the result does not depend on it. `stored` below float32 (S = float only) rounds
/// what a GPU kernel stores: the features, the key state once reduced, and on the support the exponentials and
/// feature products before their products with V, after their row sums (kScatterbrainRounding).
template <typename S>
MatrixT<S> scatterbrain_attention(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                  VectorD* log_denominator = nullptr, ThreadPool* pool = nullptr,
                                  Precision stored = Precision::kF32);

/// The rounding points of scatterbrain below float32 (Capabilities::rounding, docs/precision.md).
inline constexpr const char* kScatterbrainRounding =
    "full form: the features exp(·) (shifted per feature, so ≤ 1) stored in the precision, the key state Σφ(k)vᵀ and "
    "Σφ(k) stored in it once reduced; on the support, the exact exponentials and the feature products φ(q)·φ(k) "
    "(float32 logits and products, one shift per row) stored in it for their products with V, after their float32 "
    "row sums (as P in FlashAttention-2); causal form: the prefix state Σφ(k)vᵀ, Σφ(k) stored after every key (as "
    "performer's causal form), the query's feature weights and the window's exponentials and feature products stored "
    "for their products; the global-minus-support difference and the ratio accumulated wider; output rounded";

}  // namespace attnprobe
