// YOSO's hash codes on the GPU (mirrors lsh.cpp), from the same keyed Philox
// streams: the Gaussian hyperplanes are normal(row = f·τ + b, t) of Purpose::kHashProjection and
// the Hadamard signs sign(part·3 + d, c) of Purpose::kSignFlip, exactly as on the host; projections
// are float64, so the codes are identical to the CPU's (a sign could differ only for a projection
// within ~1e-16 of zero).
#include "attnprobe/estimators/yoso/lsh_cuda.h"
#include "attnprobe/estimators/yoso/walsh_hadamard.h"
#include "attnprobe/gpu/cuda_check.cuh"

namespace attnprobe::gpu {

namespace {
constexpr int kMaxPadded = 256;

__global__ void gaussian_rows_kernel(RandomStream stream, int64_t rows, int p, double* r) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= rows * p) return;
  r[idx] = stream.normal(static_cast<uint32_t>(idx / p), static_cast<uint32_t>(idx % p), 0);
}

__global__ void gaussian_codes_kernel(const double* x, const double* r, int n, int p, int m, int tau, uint32_t* codes) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // (i, f)
  if (idx >= static_cast<int64_t>(n) * m) return;
  const int f = static_cast<int>(idx % m);
  const int64_t i = idx / m;
  uint32_t code = 0;
  for (int b = 0; b < tau; ++b) {
    const double* row = r + static_cast<int64_t>(f * tau + b) * p;
    double projection = 0;
    for (int c = 0; c < p; ++c) projection += x[i * p + c] * row[c];
    code |= static_cast<uint32_t>(projection > 0) << b;
  }
  codes[idx] = code;
}

__global__ void hadamard_codes_kernel(RandomStream stream, const double* x, int n, int p, int padded, int m, int tau,
                                      uint32_t* codes) {
  const int per_part = padded / tau;
  const int parts = (m + per_part - 1) / per_part;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // (i, part)
  if (idx >= static_cast<int64_t>(n) * parts) return;
  const int t = static_cast<int>(idx % parts);
  const int64_t i = idx / parts;
  double y[kMaxPadded];
  for (int c = 0; c < padded; ++c) y[c] = c < p ? x[i * p + c] : 0.0;
  for (int d = 0; d < 3; ++d) {
    for (int c = 0; c < padded; ++c) y[c] *= stream.sign(static_cast<uint32_t>(t * 3 + d), static_cast<uint32_t>(c));
    fast_walsh_hadamard(y, padded);  // the host's own transform (walsh_hadamard.h)
  }
  hadamard_part_codes(y, t, per_part, m, tau, codes + i * m);
}
}  // namespace

void lsh_codes(const double* x, int64_t n, int64_t p, int m, int tau, bool hadamard, RandomKey key, uint32_t* codes) {
  DeviceBuffer<double> dx(x, n * p);
  DeviceBuffer<uint32_t> dcodes(n * m);
  if (!hadamard) {
    const int64_t rows = static_cast<int64_t>(m) * tau;
    DeviceBuffer<double> r(rows * p);
    gaussian_rows_kernel<<<blocks_for(rows * p, 256), 256>>>(RandomStream(key, Purpose::kHashProjection), rows,
                                                             static_cast<int>(p), r.get());
    check_launch("gaussian_rows_kernel");
    gaussian_codes_kernel<<<blocks_for(n * m, 128), 128>>>(dx.get(), r.get(), static_cast<int>(n), static_cast<int>(p),
                                                           m, tau, dcodes.get());
    check_launch("gaussian_codes_kernel");
  } else {
    int padded = 1;
    while (padded < p) padded *= 2;
    if (padded > kMaxPadded) throw InputError("CUDA hadamard hashing supports head dims up to 256");
    if (tau > padded) throw InputError("yoso(hash=hadamard): tau exceeds the padded head dim");
    const int parts = (m + padded / tau - 1) / (padded / tau);
    hadamard_codes_kernel<<<blocks_for(n * parts, 64), 64>>>(RandomStream(key, Purpose::kSignFlip), dx.get(),
                                                             static_cast<int>(n), static_cast<int>(p), padded, m, tau,
                                                             dcodes.get());
    check_launch("hadamard_codes_kernel");
  }
  dcodes.download(codes);
}

}  // namespace attnprobe::gpu
