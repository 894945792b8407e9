#pragma once
// The decoded parameters of yoso-e and yoso, shared by the CPU versions (yoso_e.cpp, yoso.cpp) and
// the CUDA ones (gpu/yoso.cu): one decoding, so a key means the same on every device.
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"

namespace attnprobe {

struct YosoExpectationParams {
  int tau = 8;  ///< hyperplane bits per hash: W_ij = (1 − θ_ij/π)^τ

  static YosoExpectationParams from_spec(const Spec& spec) { return {static_cast<int>(spec.get_int("tau"))}; }
};

struct YosoParams {
  int m = 32;                      ///< number of hashes
  int tau = 8;                     ///< bits per hash
  LshKind hash = LshKind::kGauss;  ///< Gaussian hyperplanes (unbiased) or the fast Hadamard transform
  bool normalize = true;           ///< ℓ2-normalise the output rows (norm=l2)

  static YosoParams from_spec(const Spec& spec) {
    return {static_cast<int>(spec.get_int("m")), static_cast<int>(spec.get_int("tau")),
            spec.get_choice("hash") == "hadamard" ? LshKind::kHadamard : LshKind::kGauss,
            spec.get_choice("norm") == "l2"};
  }
};

}  // namespace attnprobe
