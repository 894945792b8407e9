// YOSO-m on the GPU (mirrors yoso.cpp): the bucket tables, filled with atomics and read per (query, column).
// The hash codes come from lsh.cu (the same Philox counters as the host's).
#include <string>

#include "attnprobe/estimators/yoso/yoso/yoso_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"

namespace attnprobe::gpu {

namespace {

__global__ void fill_tables_kernel(const uint32_t* key_codes, const float* v, int keys, int pv, int m, int64_t buckets,
                                   float* tables) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // (j, f, c)
  if (idx >= static_cast<int64_t>(keys) * m * pv) return;
  const int c = static_cast<int>(idx % pv);
  const int f = static_cast<int>((idx / pv) % m);
  const int64_t j = idx / (static_cast<int64_t>(pv) * m);
  const uint32_t code = key_codes[j * m + f];
  atomicAdd(&tables[(f * buckets + code) * pv + c], v[j * pv + c]);
}

__global__ void read_tables_kernel(const uint32_t* query_codes, const float* tables, int n, int pv, int m,
                                   int64_t buckets, float* y) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // (i, c)
  if (idx >= static_cast<int64_t>(n) * pv) return;
  const int c = static_cast<int>(idx % pv);
  const int64_t i = idx / pv;
  float sum = 0;
  for (int f = 0; f < m; ++f) sum += tables[(f * buckets + query_codes[i * m + f]) * pv + c];
  y[idx] = sum / m;
}

}  // namespace

void yoso_tables_cuda(const YosoTablesCudaParams& params) {
  const uint32_t *query_codes = params.query_codes, *key_codes = params.key_codes;
  const float* v = params.v;
  const int64_t n = params.n, keys = params.keys, pv = params.pv;
  const int m = params.m, tau = params.tau;
  const int64_t buckets = int64_t{1} << tau;
  const int64_t table_floats = static_cast<int64_t>(m) * buckets * pv;
  if (table_floats > (int64_t{1} << 30))
    throw InputError("CUDA yoso: m * 2^tau * pv = " + std::to_string(table_floats) +
                     " table entries exceed 2^30 (4 GiB); use a smaller tau or m, or --device cpu");
  DeviceBuffer<uint32_t> dq(query_codes, n * m), dk(key_codes, keys * m);
  DeviceBuffer<float> dv(v, keys * pv), tables(table_floats), dy(n * pv);
  tables.zero();
  fill_tables_kernel<<<blocks_for(keys * m * pv, 256), 256>>>(dk.get(), dv.get(), static_cast<int>(keys),
                                                              static_cast<int>(pv), m, buckets, tables.get());
  check_launch("fill_tables_kernel");
  read_tables_kernel<<<blocks_for(n * pv, 256), 256>>>(dq.get(), tables.get(), static_cast<int>(n),
                                                       static_cast<int>(pv), m, buckets, dy.get());
  check_launch("read_tables_kernel");
  dy.download(params.y);
}

}  // namespace attnprobe::gpu
