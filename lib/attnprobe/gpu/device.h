#pragma once
// Host-side entry points of the CUDA backend. Available when ATTNPROBE_HAVE_CUDA is defined.
#include <cstdint>
#include <string>
#include <vector>

#include "attnprobe/rng/random_stream.h"

namespace attnprobe::gpu {

/// Number of visible CUDA devices (0 when none or no driver); never throws.
int device_count();
/// "NVIDIA H100 ..." for device 0, or the reason there is none.
std::string device_description();

/// Fills out[i] with RandomStream(key, purpose).bits(i, b, c).v[word] computed on the device,
/// for i in [0, count). Throws std::runtime_error on a CUDA error.
std::vector<uint32_t> philox_words(RandomKey key, Purpose purpose, uint32_t b, uint32_t c, int word, int64_t count);

/// The same for normal(i, t, c): element t of row i, for i in [0, count).
std::vector<double> normals(RandomKey key, Purpose purpose, uint32_t t, uint32_t c, int64_t count);

}  // namespace attnprobe::gpu
