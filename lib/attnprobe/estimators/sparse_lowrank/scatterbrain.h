#pragma once
// scatterbrain — exact attention on a sparse support plus random features off it; see scatterbrain.cpp.
#include <cstdint>
#include <vector>

#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/random_features/gerf.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

class Spec;

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
  /// Decodes scatterbrain(M, sparse, w, ext, rounds, features, ortho); UsageError (a spec error) for sparse=block, w=0.
  static ScatterbrainParams from_spec(const Spec& spec);
};

/// Per-query supports S_i as compressed rows: the keys of row i are keys[offsets[i] .. offsets[i+1]),
/// ascending and distinct.
struct SparseSupport {
  std::vector<int64_t> offsets;  ///< n + 1
  std::vector<int32_t> keys;
};

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
/// Row i equals the full form's last row on the prefix 0..i with the same key.
MatrixD scatterbrain_causal_attention(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                      VectorD* log_denominator = nullptr);

/// n × pv estimate in precision S; log_denominator (optional) receives log D̂_i (float64). The features
/// and the query chunks run on the pool when one is given (all supports but multi-round smyrf, whose
/// rounds merge into shared sums); the result does not depend on it.
template <typename S>
MatrixT<S> scatterbrain_attention(const ScatterbrainParams& params, const HeadView& view, RandomKey key,
                                  VectorD* log_denominator = nullptr, ThreadPool* pool = nullptr);

}  // namespace attnprobe
