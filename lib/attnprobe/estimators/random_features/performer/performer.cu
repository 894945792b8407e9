// Performer on the GPU (mirrors performer.cpp), float64 throughout: query
// features exp(ω·q̃ − row max), key features exp(ω·k̃ − ‖k̃‖²/2 − slice max), then the ratio
// φ(q)·(φ(K)ᵀV) / φ(q)·Σ_j φ(k_j). The features ω are drawn on the host by the same function as
// the CPU estimator and uploaded, so both use identical random features.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnprobe/estimators/random_features/performer/performer_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"

namespace attnprobe::gpu {

namespace {
constexpr int kWarps = 8;  // feature kernels: one warp per row at a time
constexpr int kRowsPerBlock =
    64;  // rows per block: ω is staged once per 64 rows (8 re-staged it 8× as often: docs/history/gpu-runs.md, run 6)
constexpr int kChunk = 256;  // keys per block of the key summary
constexpr int kSub = 32;     // keys staged in shared memory at a time

// One warp per row x_i: logits(i, m) = x_i·ω_m − (subtract_norm ? ‖x_i‖²/2 : 0) for m < M. Query rows
// (subtract_norm false) are finished here: out(i, m) = exp(logit − max_m logit). Key rows keep the
// logit, and their row maximum goes to row_max (the slice maximum is taken next). ω is staged
// transposed (ωᵀ: p × M) in shared memory, so the lanes of a warp read consecutive features.
__global__ void features_kernel(const double* x, const double* omegas, int rows, int p, int features,
                                bool subtract_norm, double* out, double* row_max) {
  extern __shared__ double omega_t[];  // p × features
  for (int idx = threadIdx.x; idx < p * features; idx += blockDim.x) {
    const int m = idx / p, c = idx % p;
    omega_t[c * features + m] = omegas[idx];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kRowsPerBlock; r += kWarps) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + r;
    if (i >= rows) return;
    const double* xi = x + i * p;
    double norm2 = 0;
    if (subtract_norm)
      for (int c = 0; c < p; ++c) norm2 += xi[c] * xi[c];
    double best = -INFINITY;
    for (int m = lane; m < features; m += 32) {
      double dot = 0;
      for (int c = 0; c < p; ++c) dot += xi[c] * omega_t[c * features + m];
      const double logit = subtract_norm ? dot - 0.5 * norm2 : dot;
      out[i * features + m] = logit;
      best = fmax(best, logit);
    }
    for (int offset = 16; offset > 0; offset /= 2) best = fmax(best, __shfl_xor_sync(0xffffffffu, best, offset));
    if (subtract_norm) {
      if (lane == 0) row_max[i] = best;
    } else {
      for (int m = lane; m < features; m += 32) out[i * features + m] = exp(out[i * features + m] - best);
    }
  }
}

// max over rows of row_max, into *slice_max (one block).
__global__ void slice_max_kernel(const double* row_max, int rows, double* slice_max) {
  __shared__ double warp_max[32];
  double best = -INFINITY;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) best = fmax(best, row_max[r]);
  for (int offset = 16; offset > 0; offset /= 2) best = fmax(best, __shfl_xor_sync(0xffffffffu, best, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) best = fmax(best, warp_max[w]);
    *slice_max = fmax(best, warp_max[0]);
  }
}

// partial(chunk, m, c) = Σ_{j in chunk} exp(klogit(j, m) − slice_max)·[v_j, 1](c), c ≤ pv (column pv
// sums the features alone). Each thread owns 4 features × 4 columns, keys staged kSub at a time.
__global__ void key_summary_kernel(const double* klogits, const double* v, const double* slice_max, int keys,
                                   int features, int pv, double* partial) {
  extern __shared__ double staged[];  // kf: kSub × features, then [v, 1]: kSub × (pv + 1)
  double* kf = staged;
  double* vv = staged + kSub * features;
  const int cols = pv + 1, mt = (features + 3) / 4, ct = (cols + 3) / 4;
  const double shift = *slice_max;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int last = static_cast<int>(min(static_cast<int64_t>(kChunk), keys - first));
  const int rounds = (mt * ct + blockDim.x - 1) / blockDim.x;  // the same for every thread (barriers below)
  for (int round = 0; round < rounds; ++round) {
    const int tile = round * blockDim.x + threadIdx.x;
    const bool active = tile < mt * ct;
    const int m0 = (tile / ct) * 4, c0 = (tile % ct) * 4;
    double acc[4][4] = {};
    for (int s = 0; s < last; s += kSub) {
      const int count = min(kSub, last - s);
      __syncthreads();
      for (int idx = threadIdx.x; idx < count * features; idx += blockDim.x)
        kf[idx] = exp(klogits[(first + s) * features + idx] - shift);
      for (int idx = threadIdx.x; idx < count * cols; idx += blockDim.x) {
        const int j = idx / cols, c = idx % cols;
        vv[idx] = c < pv ? v[(first + s + j) * pv + c] : 1.0;
      }
      __syncthreads();
      if (active)
        for (int j = 0; j < count; ++j) {
          double a[4], b[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            a[r] = m0 + r < features ? kf[j * features + m0 + r] : 0.0;
            b[r] = c0 + r < cols ? vv[j * cols + c0 + r] : 0.0;
          }
#pragma unroll
          for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][e] += a[r] * b[e];
        }
    }
    if (active)
      for (int r = 0; r < 4; ++r)
        for (int e = 0; e < 4; ++e)
          if (m0 + r < features && c0 + e < cols)
            partial[(static_cast<int64_t>(blockIdx.x) * features + m0 + r) * cols + c0 + e] = acc[r][e];
  }
}

// kv(m, c) = Σ_chunks partial(chunk, m, c): one block per entry, deterministic order.
__global__ void sum_partials_kernel(const double* partial, int chunks, int entries, double* kv) {
  __shared__ double warp_sums[8];
  const int e = blockIdx.x;
  double sum = 0;
  for (int b = threadIdx.x; b < chunks; b += blockDim.x) sum += partial[static_cast<int64_t>(b) * entries + e];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w];
    kv[e] = total;
  }
}

// The causal form (estimators/random_features/performer.cpp, estimate_causal): the CPU adds one key
// at a time to per-feature sums under each feature's running maximum c_m of the key log-features. Here
// the tokens come in chunks of kCausalChunk: (1) each chunk's own sums under its own maximum, (2) in
// place, each chunk's prefix (the sums of every earlier chunk, combined in order, one warp per
// feature), (3) each row from its chunk's prefix and the chunk's keys up to itself. So row i reads
// tokens 0..i only, and its sums are the CPU's up to rounding. Summary layout per (chunk, feature):
// c, z, kv[0..pv).
constexpr int kCausalChunk = 32;
constexpr int kCausalMaxDim = 128;  // value columns: 4 per lane

__global__ void chunk_summary_kernel(const double* kl, const double* v, int n, int features, int pv, double* summary) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = (n + kCausalChunk - 1) / kCausalChunk;
  if (warp >= static_cast<int64_t>(chunks) * features) return;
  const int b = static_cast<int>(warp / features), m = static_cast<int>(warp % features);
  const int j0 = b * kCausalChunk, j1 = min(n, j0 + kCausalChunk);
  double c = -INFINITY;
  for (int j = j0; j < j1; ++j) c = fmax(c, kl[static_cast<int64_t>(j) * features + m]);
  double z = 0, kv[4] = {0, 0, 0, 0};
  for (int j = j0; j < j1; ++j) {
    const double w = exp(kl[static_cast<int64_t>(j) * features + m] - c);
    z += w;
#pragma unroll
    for (int s = 0; s < 4; ++s)
      if (lane + 32 * s < pv) kv[s] += w * v[static_cast<int64_t>(j) * pv + lane + 32 * s];
  }
  double* out = summary + warp * (pv + 2);
  if (lane == 0) out[0] = c, out[1] = z;
#pragma unroll
  for (int s = 0; s < 4; ++s)
    if (lane + 32 * s < pv) out[2 + lane + 32 * s] = kv[s];
}

__global__ void chunk_prefix_kernel(double* summary, int chunks, int features, int pv) {
  const int m = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (m >= features) return;
  double c = -INFINITY, z = 0, kv[4] = {0, 0, 0, 0};  // the sums of the chunks before b
  for (int b = 0; b < chunks; ++b) {
    double* entry = summary + (static_cast<int64_t>(b) * features + m) * (pv + 2);
    const double chunk_c = entry[0], chunk_z = entry[1];
    double chunk_kv[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) chunk_kv[s] = lane + 32 * s < pv ? entry[2 + lane + 32 * s] : 0.0;
    __syncwarp();  // every lane has read the chunk's c and z before lane 0 overwrites them
    if (lane == 0) entry[0] = c, entry[1] = z;
#pragma unroll
    for (int s = 0; s < 4; ++s)
      if (lane + 32 * s < pv) entry[2 + lane + 32 * s] = kv[s];
    const double top = fmax(c, chunk_c);                             // finite: a chunk's own maximum is
    const double before = exp(c - top), after = exp(chunk_c - top);  // before = 0 while c = −∞
    z = z * before + chunk_z * after;
#pragma unroll
    for (int s = 0; s < 4; ++s) kv[s] = kv[s] * before + chunk_kv[s] * after;
    c = top;
  }
}

// One warp per row i: pass 1 takes the row's maximum over features of ql(i, m) + c_im, where c_im is
// feature m's running maximum after key i (its chunk prefix's and the chunk's keys j ≤ i); pass 2
// forms, per feature, S_im = e^{c_prefix − c_im}·kv_prefix + Σ_{j in chunk, j ≤ i} e^{kl(j, m) − c_im}·v_j
// and z_im likewise, and out_i = Σ_m a_im·S_im / Σ_m a_im·z_im with a_im = exp(ql + c_im − maximum)
// (the CPU's weights; the denominator is ≥ 1).
__global__ void causal_rows_kernel(const double* ql, const double* kl, const double* v, const double* prefix, int n,
                                   int features, int pv, float* out) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (i >= n) return;
  const int b = static_cast<int>(i / kCausalChunk), j0 = b * kCausalChunk;
  auto running_max = [&](int m, double prefix_c) {
    double c = prefix_c;
    for (int64_t j = j0; j <= i; ++j) c = fmax(c, kl[j * features + m]);
    return c;
  };
  double top = -INFINITY;
  for (int m = lane; m < features; m += 32) {
    const double prefix_c = prefix[(static_cast<int64_t>(b) * features + m) * (pv + 2)];
    top = fmax(top, ql[i * features + m] + running_max(m, prefix_c));
  }
  for (int offset = 16; offset > 0; offset /= 2) top = fmax(top, __shfl_xor_sync(0xffffffffu, top, offset));
  double numerator[4] = {0, 0, 0, 0}, denominator = 0;
  for (int m = 0; m < features; ++m) {
    const double* entry = prefix + (static_cast<int64_t>(b) * features + m) * (pv + 2);
    const double c = running_max(m, entry[0]);
    const double scale_prefix = exp(entry[0] - c);  // 0 for the first chunk (c = −∞ there)
    double z = entry[1] * scale_prefix, sums[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) sums[s] = lane + 32 * s < pv ? entry[2 + lane + 32 * s] * scale_prefix : 0.0;
    for (int64_t j = j0; j <= i; ++j) {
      const double w = exp(kl[j * features + m] - c);
      z += w;
#pragma unroll
      for (int s = 0; s < 4; ++s)
        if (lane + 32 * s < pv) sums[s] += w * v[j * pv + lane + 32 * s];
    }
    const double a = exp(ql[i * features + m] + c - top);
    denominator += a * z;
#pragma unroll
    for (int s = 0; s < 4; ++s) numerator[s] += a * sums[s];
  }
#pragma unroll
  for (int s = 0; s < 4; ++s)
    if (lane + 32 * s < pv) out[i * pv + lane + 32 * s] = static_cast<float>(numerator[s] / denominator);
}

// out(i, c) = Σ_m qf(i, m)·kv(m, c) / Σ_m qf(i, m)·kv(m, pv)
__global__ void ratio_kernel(const double* qf, const double* kv, int n, int features, int pv, float* out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(n) * pv) return;
  const int c = static_cast<int>(idx % pv);
  const int64_t i = idx / pv;
  double numerator = 0, denominator = 0;
  for (int m = 0; m < features; ++m) {
    const double f = qf[i * features + m];
    numerator += f * kv[static_cast<int64_t>(m) * (pv + 1) + c];
    denominator += f * kv[static_cast<int64_t>(m) * (pv + 1) + pv];
  }
  out[idx] = static_cast<float>(numerator / denominator);
}
// Once per process: the feature and key-summary kernels may take up to 200 KiB of shared memory
// (both the full form and the causal one launch features_kernel).
void allow_large_shared_memory() {
  static const bool kSet = [] {
    check_cuda(cudaFuncSetAttribute(features_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024),
               "cudaFuncSetAttribute(features_kernel)");
    check_cuda(cudaFuncSetAttribute(key_summary_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024),
               "cudaFuncSetAttribute(key_summary_kernel)");
    return true;
  }();
  (void)kSet;
}
}  // namespace

void performer_device(const double* q_scaled, const double* k_scaled, const double* v, const double* omegas, int64_t n,
                      int64_t keys, int64_t p, int64_t pv, int64_t features, Scratch& scratch, float* out,
                      cudaStream_t stream) {
  const int ni = static_cast<int>(n), ki = static_cast<int>(keys), pi = static_cast<int>(p), pvi = static_cast<int>(pv),
            mi = static_cast<int>(features);
  const size_t omega_shared = static_cast<size_t>(p) * features * sizeof(double);
  const size_t summary_shared = static_cast<size_t>(kSub) * (features + pv + 1) * sizeof(double);
  if (omega_shared > 200 * 1024 || summary_shared > 200 * 1024)
    throw InputError("CUDA performer: M·p = " + std::to_string(features * p) + " exceeds its shared memory");
  allow_large_shared_memory();
  const int chunks = static_cast<int>((keys + kChunk - 1) / kChunk);
  const int64_t entries = features * (pv + 1);
  // scratch: qf (n × M), key logits (keys × M), key row maxima, slice max, partials, kv
  const size_t doubles = n * features + keys * features + keys + 1 + chunks * entries + entries;
  double* qf = static_cast<double*>(scratch.get(doubles * sizeof(double)));
  double *kl = qf + n * features, *row_max = kl + keys * features, *slice_max = row_max + keys;
  double *partial = slice_max + 1, *kv = partial + chunks * entries;
  features_kernel<<<blocks_for(n, kRowsPerBlock), kWarps * 32, omega_shared, stream>>>(q_scaled, omegas, ni, pi, mi,
                                                                                       false, qf, nullptr);
  features_kernel<<<blocks_for(keys, kRowsPerBlock), kWarps * 32, omega_shared, stream>>>(k_scaled, omegas, ki, pi, mi,
                                                                                          true, kl, row_max);
  slice_max_kernel<<<1, 1024, 0, stream>>>(row_max, ki, slice_max);
  const int tiles = static_cast<int>(((features + 3) / 4) * ((pv + 4) / 4));  // 4 × 4 (feature, column) tiles
  const int summary_threads = std::min(1024, (tiles + 31) / 32 * 32);
  key_summary_kernel<<<chunks, summary_threads, summary_shared, stream>>>(kl, v, slice_max, ki, mi, pvi, partial);
  sum_partials_kernel<<<static_cast<unsigned>(entries), 256, 0, stream>>>(partial, chunks, static_cast<int>(entries),
                                                                          kv);
  ratio_kernel<<<blocks_for(n * pv, 256), 256, 0, stream>>>(qf, kv, ni, mi, pvi, out);
  check_cuda(cudaGetLastError(), "performer kernels");
}

void performer_causal_device(const double* q_scaled, const double* k_scaled, const double* v, const double* omegas,
                             int64_t n, int64_t p, int64_t pv, int64_t features, Scratch& scratch, float* out,
                             cudaStream_t stream) {
  if (pv > kCausalMaxDim)
    throw InputError("CUDA performer's causal form supports value dims up to " + std::to_string(kCausalMaxDim) +
                     " (got " + std::to_string(pv) + "); use --device cpu");
  const int ni = static_cast<int>(n), pi = static_cast<int>(p), pvi = static_cast<int>(pv),
            mi = static_cast<int>(features);
  const size_t omega_shared = static_cast<size_t>(p) * features * sizeof(double);
  if (omega_shared > 200 * 1024)
    throw InputError("CUDA performer: M·p = " + std::to_string(features * p) + " exceeds its shared memory");
  allow_large_shared_memory();
  const int chunks = static_cast<int>((n + kCausalChunk - 1) / kCausalChunk);
  // scratch: query and key log-features (n × M each), their row maxima (unused), the chunk summaries
  const size_t doubles = 2 * n * features + n + static_cast<size_t>(chunks) * features * (pv + 2);
  double* ql = static_cast<double*>(scratch.get(doubles * sizeof(double)));
  double *kl = ql + n * features, *row_max = kl + n * features, *summary = row_max + n;
  // Both sides' log-features log ξ = ω·x̃ − ‖x̃‖²/2 (the CPU's log_features).
  features_kernel<<<blocks_for(n, kRowsPerBlock), kWarps * 32, omega_shared, stream>>>(q_scaled, omegas, ni, pi, mi,
                                                                                       true, ql, row_max);
  features_kernel<<<blocks_for(n, kRowsPerBlock), kWarps * 32, omega_shared, stream>>>(k_scaled, omegas, ni, pi, mi,
                                                                                       true, kl, row_max);
  const int64_t warps = static_cast<int64_t>(chunks) * features;
  chunk_summary_kernel<<<blocks_for(warps * 32, 256), 256, 0, stream>>>(kl, v, ni, mi, pvi, summary);
  chunk_prefix_kernel<<<blocks_for(features * 32, 256), 256, 0, stream>>>(summary, chunks, mi, pvi);
  causal_rows_kernel<<<blocks_for(n * 32, 256), 256, 0, stream>>>(ql, kl, v, summary, ni, mi, pvi, out);
  check_cuda(cudaGetLastError(), "causal performer kernels");
}

void performer_cuda(const PerformerCudaParams& params) {
  const int64_t n = params.n, keys = params.keys, p = params.p, pv = params.pv, features = params.features;
  if (params.causal && keys != n) throw std::runtime_error("causal performer needs as many keys as queries");
  DeviceBuffer<double> dq(params.q_scaled, n * p), dk(params.k_scaled, keys * p), dv(params.v, keys * pv),
      dw(params.omegas, features * p);
  DeviceBuffer<float> dout(n * pv);
  thread_local Scratch scratch;
  if (params.causal)
    performer_causal_device(dq.get(), dk.get(), dv.get(), dw.get(), n, p, pv, features, scratch, dout.get(), nullptr);
  else
    performer_device(dq.get(), dk.get(), dv.get(), dw.get(), n, keys, p, pv, features, scratch, dout.get(), nullptr);
  check_launch("performer");
  dout.download(params.out);
}

}  // namespace attnprobe::gpu
