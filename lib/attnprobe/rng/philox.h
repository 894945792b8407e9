#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of docs/randomness.md. Compiles for host and CUDA device alike, so the GPU
// backend draws bit-identical numbers. Checked against the Random123 known-answer vectors.
#include <cstdint>

#if defined(__CUDACC__)
#define ATTNPROBE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ATTNPROBE_HOST_DEVICE inline
#endif

namespace attnprobe {

struct PhiloxCounter {
  uint32_t v[4];
};
struct PhiloxKey {
  uint32_t v[2];
};

namespace philox_detail {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

ATTNPROBE_HOST_DEVICE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

ATTNPROBE_HOST_DEVICE PhiloxCounter round(PhiloxCounter c, PhiloxKey k) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kMul0, c.v[0], hi0, lo0);
  mulhilo(kMul1, c.v[2], hi1, lo1);
  return PhiloxCounter{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}
}  // namespace philox_detail

/// The 10-round Philox4x32 bijection: 128-bit counter × 64-bit key → 128 random bits.
ATTNPROBE_HOST_DEVICE PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key.v[0] += philox_detail::kWeyl0;
      key.v[1] += philox_detail::kWeyl1;
    }
    counter = philox_detail::round(counter, key);
  }
  return counter;
}

/// 32 random bits → uniform float in (0, 1]: never 0, so log() and 1/u are always finite.
ATTNPROBE_HOST_DEVICE float uint_to_unit_float(uint32_t x) {
  return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

/// 64 random bits → uniform double in (0, 1] with 53 significant bits.
ATTNPROBE_HOST_DEVICE double uint_to_unit_double(uint32_t hi, uint32_t lo) {
  uint64_t bits = (static_cast<uint64_t>(hi) << 32 | lo) >> 11;
  return (static_cast<double>(bits) + 1.0) * (1.0 / 9007199254740992.0);
}

}  // namespace attnprobe
