#pragma once
// favorpp — FAVOR++ (optimal positive random features) and the FAVOR# variants; see favorpp.cpp.
#include <cstdint>

#include "attnprobe/estimators/common/precision.h"
#include "attnprobe/estimators/random_features/gerf.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

class Spec;

struct FavorppParams {
  int64_t features = 64;  ///< M
  bool orthogonal = true;
  GerfOptions gerf;
  /// Decodes favorpp(M, ortho, a, variant, arf_ref, s); UsageError (a spec error) for a ≥ 1/8, s = 0, or s = −1 with a
  /// variant other than oprf or with a = opt.
  static FavorppParams from_spec(const Spec& spec);
};

/// The n × pv estimate in precision S (float: the registered estimator; double: tests). `map`, when
/// given, receives the fitted feature map.
template <typename S>
MatrixT<S> favorpp_attention(const FavorppParams& params, const HeadView& view, RandomKey key, GerfMap* map = nullptr);

}  // namespace attnprobe
