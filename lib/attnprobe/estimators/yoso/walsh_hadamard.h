#pragma once
// The pieces of YOSO's hashes that the CPU (lsh.cpp) and the GPU (gpu/lsh.cu) must do identically:
// the in-place unnormalised fast Walsh–Hadamard transform (Sylvester order) and the code of τ
// projections. Compiled for host and device alike; no Eigen here, nvcc includes this header.
#include <cstdint>

#include "attnprobe/rng/philox.h"  // ATTNPROBE_HOST_DEVICE

namespace attnprobe {

/// x has 2^k entries; O(length · log length) additions.
ATTNPROBE_HOST_DEVICE void fast_walsh_hadamard(double* x, int64_t length) {
  for (int64_t half = 1; half < length; half *= 2)
    for (int64_t start = 0; start < length; start += 2 * half)
      for (int64_t i = start; i < start + half; ++i) {
        const double a = x[i], b = x[i + half];
        x[i] = a + b;
        x[i + half] = a - b;
      }
}

/// The code of τ projections: bit b is [projections[b] > 0] (a projection of exactly 0 gives 0).
ATTNPROBE_HOST_DEVICE uint32_t sign_code(const double* projections, int tau) {
  uint32_t code = 0;
  for (int b = 0; b < tau; ++b) code |= static_cast<uint32_t>(projections[b] > 0) << b;
  return code;
}

/// The codes of Hadamard part `part` from its transformed vector y: hash f = part·k + j (k = per_part)
/// reads coordinates j·τ … j·τ+τ−1; codes_row is row i of the n × m code matrix.
ATTNPROBE_HOST_DEVICE void hadamard_part_codes(const double* y, int part, int per_part, int m, int tau,
                                               uint32_t* codes_row) {
  for (int j = 0; j < per_part; ++j) {
    const int f = part * per_part + j;
    if (f >= m) break;
    codes_row[f] = sign_code(y + j * tau, tau);
  }
}

}  // namespace attnprobe
