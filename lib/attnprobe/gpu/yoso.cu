// YOSO on the GPU (mirrors estimators/yoso/yoso_e.cpp and yoso.cpp): the expectation, one warp
// per query row; and YOSO-m's bucket tables, filled with atomics and read per (query, column).
#include <algorithm>
#include <cmath>
#include <string>

#include "attnprobe/estimators/yoso/yoso_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/kernels.h"
#include "attnprobe/gpu/warp_rows.cuh"

namespace attnprobe::gpu {

namespace {

// YOSO-E, one warp per query row (the layout of exact_attention.cu's CUDA-core kernel): lane j forms
// the weight (1 − acos(q̂_i·k̂_j)/π)^τ of the tile's key j, lane c accumulates output columns c,
// c + 32, ... over the tile's keys in order (so each column sums its keys in sequence, as the old
// one-thread-per-row kernel did), then the row is ℓ2-normalised by a warp reduction. D ≥ max(p, pv),
// a multiple of 32 (input=lift hashes p + 2 dimensions, so 160 covers p = 128).
template <int D>
__global__ void __launch_bounds__(kWarpRows * 32)
    yoso_expectation_kernel(const float* q_hat, const float* k_hat, const float* v, int n, int keys, int p, int pv,
                            int tau, bool causal, float* out) {
  constexpr int kCols = D / 32;  // output columns per lane
  __shared__ WarpRowTiles<D> tiles;
  __shared__ float weights[kWarpRows][kWarpRowKeys];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * kWarpRows, i = row0 + warp;
  tiles.stage_queries(q_hat, row0, n, p);
  float acc[kCols];
#pragma unroll
  for (int s = 0; s < kCols; ++s) acc[s] = 0;
  const int key_end = causal ? min(keys, min(n, row0 + kWarpRows)) : keys;  // causal: W_ij = 0 for j > i
  for (int t0 = 0; t0 < key_end; t0 += kWarpRowKeys) {
    __syncthreads();  // the previous tile is consumed (and, the first time, q̂ is staged)
    tiles.stage_keys(k_hat, v, t0, keys, p, pv);
    __syncthreads();
    const int key = t0 + lane;
    const float cosine =
        fminf(1.0f, fmaxf(-1.0f, tiles.template dot<float>(warp, lane)));  // clamp before acos: q̂·q̂ can round above 1
    const float base = 1.0f - acosf(cosine) * 0.318309886183790671538f;
    float weight = 1.0f;
    for (int t = 0; t < tau; ++t) weight *= base;
    weights[warp][lane] = key < keys && (!causal || key <= i) ? weight : 0.0f;
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < kWarpRowKeys; ++j) {
      const float w = weights[warp][j];
#pragma unroll
      for (int s = 0; s < kCols; ++s) acc[s] += w * tiles.values[j * D + lane + 32 * s];
    }
    __syncwarp();  // the weights are read before the next tile overwrites them
  }
  float squares = 0;  // columns past pv hold 0 (zero-padded values)
#pragma unroll
  for (int s = 0; s < kCols; ++s) squares += acc[s] * acc[s];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  const float norm = sqrtf(squares);
  if (i < n)
#pragma unroll
    for (int s = 0; s < kCols; ++s)
      if (lane + 32 * s < pv) out[static_cast<int64_t>(i) * pv + lane + 32 * s] = norm > 0 ? acc[s] / norm : 0.0f;
}

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

void yoso_expectation(const float* q_hat, const float* k_hat, const float* v, int64_t n, int64_t keys, int64_t p,
                      int64_t pv, int tau, bool causal, float* out) {
  const int64_t d = std::max(p, pv);
  if (d > 160)
    throw InputError("CUDA yoso-e supports query, key and value dims up to 160 (got " + std::to_string(p) + ", " +
                     std::to_string(pv) + "); use --device cpu");
  DeviceBuffer<float> dq(q_hat, n * p), dk(k_hat, keys * p), dv(v, keys * pv), dout(n * pv);
  const int ni = static_cast<int>(n), ki = static_cast<int>(keys), pi = static_cast<int>(p), pvi = static_cast<int>(pv);
  const int blocks = blocks_for(n, kWarpRows), threads = kWarpRows * 32;
  if (d <= 64)
    yoso_expectation_kernel<64>
        <<<blocks, threads>>>(dq.get(), dk.get(), dv.get(), ni, ki, pi, pvi, tau, causal, dout.get());
  else if (d <= 128)
    yoso_expectation_kernel<128>
        <<<blocks, threads>>>(dq.get(), dk.get(), dv.get(), ni, ki, pi, pvi, tau, causal, dout.get());
  else
    yoso_expectation_kernel<160>
        <<<blocks, threads>>>(dq.get(), dk.get(), dv.get(), ni, ki, pi, pvi, tau, causal, dout.get());
  check_launch("yoso_expectation_kernel");
  dout.download(out);
}

void yoso_tables(const uint32_t* query_codes, const uint32_t* key_codes, const float* v, int64_t n, int64_t keys,
                 int64_t pv, int m, int tau, float* y) {
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
  dy.download(y);
}

}  // namespace attnprobe::gpu

// The CUDA versions of `yoso-e` and `yoso` (estimators/yoso/yoso_e.cpp, yoso.cpp): same params,
// and the hash codes come from the same Philox counters on the device (lsh.cu), so they are the CPU's.
// input=lift lifts on the host (yoso_inputs) and hashes in p + 2 dims. The backward pass (grad=…) is
// float64 host code: the sweep runner takes gradients from the CPU versions whatever the device.
namespace attnprobe::gpu {
namespace {

class CudaYosoExpectation final : public Estimator {
 public:
  explicit CudaYosoExpectation(YosoExpectationParams params) : params_(params) {}
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    MatrixD q_hat, k_hat;  // ℓ2 rows, or lifted rows in p + 2 dims (input=lift), as on the CPU
    yoso_inputs(view.q, view.k, params_.lift, q_hat, k_hat);
    const MatrixF q = q_hat.cast<float>(), k = k_hat.cast<float>();
    out.resize(view.n(), view.pv());
    yoso_expectation(q.data(), k.data(), view.vf.data(), view.n(), k.rows(), q.cols(), view.pv(), params_.tau,
                     view.mask == Mask::kCausal, out.data());
  }

 private:
  YosoExpectationParams params_;
};

class CudaYoso final : public Estimator {
 public:
  explicit CudaYoso(YosoParams params) : params_(params) {}
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int m = params_.m, tau = params_.tau;
    const bool hadamard = params_.hash == LshKind::kHadamard;
    std::vector<uint32_t> query_codes(view.n() * m), key_codes(view.k.rows() * m);
    // input=l2 hashes the rows as they are (a sign ignores the norm), input=lift the lifted rows in
    // p + 2 dims: the CPU version's inputs, so the codes agree bit for bit.
    MatrixD q_hat, k_hat;
    if (params_.lift) yoso_inputs(view.q, view.k, true, q_hat, k_hat);
    const MatrixD& q = params_.lift ? q_hat : view.q;
    const MatrixD& k = params_.lift ? k_hat : view.k;
    lsh_codes(q.data(), q.rows(), q.cols(), m, tau, hadamard, ctx.key, query_codes.data());
    lsh_codes(k.data(), k.rows(), k.cols(), m, tau, hadamard, ctx.key, key_codes.data());
    out.resize(view.n(), view.pv());
    yoso_tables(query_codes.data(), key_codes.data(), view.vf.data(), view.n(), view.k.rows(), view.pv(), m, tau,
                out.data());
    if (params_.normalize)
      for (int64_t i = 0; i < out.rows(); ++i) {
        const float norm = out.row(i).norm();
        if (norm > 0) out.row(i) /= norm;
      }
  }

 private:
  YosoParams params_;
};

// yoso-e's causal form (input=l2; the registry refuses input=lift under a causal mask): keys j ≤ i.
[[maybe_unused]] const bool kYosoEOnCuda = register_implementation(
    "yoso-e", Device::kCuda,
    [](const Spec& spec) { return std::make_unique<CudaYosoExpectation>(YosoExpectationParams::from_spec(spec)); },
    CausalForm::kYes);
[[maybe_unused]] const bool kYosoOnCuda = register_implementation(
    "yoso", Device::kCuda, [](const Spec& spec) { return std::make_unique<CudaYoso>(YosoParams::from_spec(spec)); });

}  // namespace
}  // namespace attnprobe::gpu
