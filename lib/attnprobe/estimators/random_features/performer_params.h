#pragma once
// The decoded parameters of performer, shared by the CPU version (performer.cpp) and the CUDA one
// (gpu/performer.cu).
#include "attnprobe/estimators/registry.h"

namespace attnprobe {

struct PerformerParams {
  int64_t features = 64;   ///< M, the number of random features
  bool orthogonal = true;  ///< ortho=1: blocks of p orthonormal directions with chi-distributed norms

  static PerformerParams from_spec(const Spec& spec) { return {spec.get_int("M"), spec.get_int("ortho") == 1}; }
};

}  // namespace attnprobe
