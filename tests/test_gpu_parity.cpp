// CPU/GPU parity of the keyed generator: the device draws exactly the host's numbers (raw words
// bit for bit; normals within a few ulps of libm vs CUDA's sin/cos/log). Built with the CUDA
// backend; skipped, with the reason, when it is not built or no GPU is visible.
#include <cmath>

#include "attnprobe/rng/random_stream.h"
#include "support.h"

#ifdef ATTNPROBE_HAVE_CUDA
#include "attnprobe/gpu/device.h"
#endif

using namespace attnprobe;
using namespace attnprobe::test;

TEST_CASE("device Philox draws the host's numbers", "[gpu]") {
#ifndef ATTNPROBE_HAVE_CUDA
  SKIP_TEST("built without the CUDA backend (ATTNPROBE_CUDA=OFF or no nvcc)");
#else
  if (gpu::device_count() == 0) SKIP_TEST("no GPU visible: " + gpu::device_description());
  const uint64_t seed = 12345;
  INFO("seed " << seed);
  const RandomKey key = make_random_key(seed, "gpu-parity", 3);
  const RandomStream host(key, Purpose::kHashProjection);
  const int64_t count = 100003;
  for (int word = 0; word < 4; ++word) {
    const auto device = gpu::philox_words(key, Purpose::kHashProjection, 7, 11, word, count);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < count; ++i) mismatches += device[i] != host.bits(static_cast<uint32_t>(i), 7, 11).v[word];
    CHECK(mismatches == 0);
  }
  const auto normals = gpu::normals(key, Purpose::kHashProjection, 5, 2, count);
  double worst = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double h = host.normal(static_cast<uint32_t>(i), 5, 2);
    worst = std::max(worst, std::abs(normals[i] - h) / std::max(1.0, std::abs(h)));
  }
  // CUDA's double log/sin/cos are within 1-2 ulp of correctly rounded, like glibc's: a few 1e-16.
  CHECK(worst < 1e-14);
#endif
}
