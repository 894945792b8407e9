#pragma once
// YOSO's hash codes on the device (lsh.cu), the same as lsh.h's on the host: shared by the CUDA
// versions of the yoso family and the parity tests.
#include <cstdint>

#include "attnprobe/rng/random_stream.h"

namespace attnprobe::gpu {

/// The codes of lsh.h, on the device: codes[i·m + f] for rows of x (n × p, float64, host memory).
void lsh_codes(const double* x, int64_t n, int64_t p, int m, int tau, bool hadamard, RandomKey key, uint32_t* codes);

}  // namespace attnprobe::gpu
