// Exact attention on the tensor cores (FlashAttention-2's scheme with TF32 mma.sync): each warp owns
// 16 or 32 query rows, the block's warps share K and V tiles staged through shared memory by cp.async
// (two stages, so the next tile loads while this one computes), and softmax is online:
//   S = Q̃·K_tileᵀ (Q̃ = scale·log2(e)·Q, so 2^S replaces e^S), m ← max(m, rowmax S),
//   O ← O·2^(m_old − m) + 2^(S − m)·V_tile, l likewise; out = O / l.
// P = 2^(S − m) never leaves registers: the accumulator layout of m16n8k8 (thread holds columns 2t,
// 2t+1 of row g) becomes the A operand of P·V by numbering the 8 keys of a step in the order
// 0,2,4,6,1,3,5,7 (A column t ↔ key 2t, column t+4 ↔ key 2t+1) and reading V's rows in that order.
// Precision: kTf32 feeds TF32 (inputs rounded to 10 mantissa bits once, in the padding pass; P in
// registers), 4.2e-4 relative error on N(0,1) inputs; kTf32x3 splits operands into TF32 parts
// (Q·Kᵀ: three parts, 6 products; P·V: two parts, 3 products; mma_split), 1e-6 error at 5× the time.
// Each key tile's P·V goes to a fresh accumulator added to O on the CUDA cores (the tensor cores'
// fp32 accumulation truncates). Speeds: PERF.md; the versions measured: docs/history/gpu-runs.md.
// Causal: key tiles wholly above the diagonal are skipped, the diagonal tiles masked per element; the
// row tiles run longest first, and the keys are split over blocks as in the full case.
// Cost: 4·n·keys·p flops (half when causal), (n + 2·keys)·p·4 bytes from memory plus L2 re-reads of K, V.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/flash_attention_tc.h"

namespace attnprobe::gpu {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// c += a·b for one m16n8k8 TF32 tile (fragments as in the PTX ISA's mma.m16n8k8 layout).
__device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += a·b for fp32 a and b on the TF32 units, in kParts-term splits x = x₁ + x₂ (+ x₃), each part
// TF32 (11 significant bits): kParts = 1 uses the values as they are (already rounded to TF32);
// 2 adds the 3 products of order ≥ 2⁻¹¹ (relative error ~2⁻²²); 3 adds the 6 of order ≥ 2⁻²²
// (~2⁻²⁴, fp32's own). Smallest terms first.
template <int kParts>
__device__ __forceinline__ void split(float x, uint32_t (&part)[kParts]) {
  part[0] = to_tf32(x);
  if constexpr (kParts >= 2) {
    const float rest = x - __uint_as_float(part[0]);  // exact
    part[1] = to_tf32(rest);
    if constexpr (kParts >= 3) part[2] = to_tf32(rest - __uint_as_float(part[1]));
  }
}

template <int kParts>
__device__ __forceinline__ void mma_split(float (&c)[4], const float (&a)[4], float b0, float b1) {
  if constexpr (kParts == 1) {
    mma_tf32(c, __float_as_uint(a[0]), __float_as_uint(a[1]), __float_as_uint(a[2]), __float_as_uint(a[3]),
             __float_as_uint(b0), __float_as_uint(b1));
  } else {
    uint32_t a0[kParts], a1[kParts], a2[kParts], a3[kParts], x0[kParts], x1[kParts];
    split<kParts>(a[0], a0);
    split<kParts>(a[1], a1);
    split<kParts>(a[2], a2);
    split<kParts>(a[3], a3);
    split<kParts>(b0, x0);
    split<kParts>(b1, x1);
    if constexpr (kParts == 3) {
      mma_tf32(c, a0[2], a1[2], a2[2], a3[2], x0[0], x1[0]);
      mma_tf32(c, a0[1], a1[1], a2[1], a3[1], x0[1], x1[1]);
      mma_tf32(c, a0[0], a1[0], a2[0], a3[0], x0[2], x1[2]);
    }
    mma_tf32(c, a0[1], a1[1], a2[1], a3[1], x0[0], x1[0]);
    mma_tf32(c, a0[0], a1[0], a2[0], a3[0], x0[1], x1[1]);
    mma_tf32(c, a0[0], a1[0], a2[0], a3[0], x0[0], x1[0]);
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

// dst (rows_padded × d) = src (rows × cols) · multiplier, zero elsewhere; rounded to TF32 when asked.
__global__ void pad_kernel(const float* src, int64_t rows, int cols, int64_t rows_padded, int d, float multiplier,
                           bool round_tf32, float* dst) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= rows_padded * d) return;
  const int64_t r = idx / d;
  const int c = static_cast<int>(idx % d);
  float x = r < rows && c < cols ? src[r * cols + c] * multiplier : 0.0f;
  if (round_tf32) x = __uint_as_float(to_tf32(x));
  dst[idx] = x;
}

// Shapes: qp (row tiles · kBlockM) × D, kp, vp (key tiles · kBlockN) × D, all padded with zeros.
// Grid: (row tiles, splits); split s covers key tiles [s·tiles_per_split, (s+1)·tiles_per_split).
// With one split the block writes out (n × pv) directly; else its normalised partial O/l to
// part_o (splits × rows_padded × D) and (m, l) to part_ml (splits × rows_padded × 2).
// Each warp owns kMTiles × 16 rows: every K or V fragment read from shared memory then feeds
// kMTiles products (with one, shared-memory bandwidth, not the tensor cores, bounds the kernel).
// kSParts, kPvParts: the TF32 split of Q·Kᵀ and of P·V (mma_split).
template <int D, int kWarps, int kMTiles, int kBlockN, int kSParts, int kPvParts, bool kCausal>
__global__ void __launch_bounds__(kWarps * 32)
    flash_tc_kernel(const float* __restrict__ qp, const float* __restrict__ kp, const float* __restrict__ vp, int n,
                    int keys, int tiles_per_split, int pv, float* __restrict__ out, float* __restrict__ part_o,
                    float* __restrict__ part_ml) {
  constexpr int kWarpRows = 16 * kMTiles;
  constexpr int kBlockM = kWarpRows * kWarps;
  constexpr int kStride = D + 4;  // + 4 floats: K-fragment reads hit 32 banks (4g + t), V reads too (8t + g)
  constexpr int kTileFloats = kBlockN * kStride;
  constexpr int kSteps = D / 8;           // k-steps of Q·Kᵀ, n-tiles of P·V
  constexpr int kKeyTiles = kBlockN / 8;  // n-tiles of Q·Kᵀ, k-steps of P·V
  // P·V goes to a fresh accumulator per key tile, added to O on the CUDA cores (fp32, rounded):
  // the tensor cores' own fp32 accumulation truncates, which over thousands of keys cost 4.6e-4
  // at n = 65536 (docs/history/gpu-runs.md, run 2). kChunk output n-tiles at a time bound the extra registers.
  constexpr int kChunk = kSParts > 1 ? 4 : (kSteps < 8 ? kSteps : 8);
  extern __shared__ float4 shared_raw[];
  float* smem = reinterpret_cast<float*>(shared_raw);  // [stage][K, V][kBlockN][kStride]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // Causal: the last row tiles have the most keys, so they start first (blocks are issued in order;
  // the cheap tiles fill the tail instead of the dearest ones).
  const int row_tile = kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x, split = blockIdx.y;
  const int warp_row0 = row_tile * kBlockM + warp * kWarpRows;  // this warp's first row
  const int block_last_row = min(n - 1, row_tile * kBlockM + kBlockM - 1);

  const int total_tiles = (keys + kBlockN - 1) / kBlockN;
  const int tile_begin = split * tiles_per_split;
  int tile_end = min(total_tiles, tile_begin + tiles_per_split);
  if constexpr (kCausal) tile_end = min(tile_end, block_last_row / kBlockN + 1);

  // This warp's Q fragments (A operand of m16n8k8: rows g and g + 8, columns t and t + 4 of each k-step).
  float qa[kMTiles][kSteps][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const float* q0 = qp + static_cast<int64_t>(warp_row0 + mt * 16 + g) * D + s * 8 + t;
      const float* q1 = q0 + 8 * D;
      qa[mt][s][0] = q0[0];
      qa[mt][s][1] = q1[0];
      qa[mt][s][2] = q0[4];
      qa[mt][s][3] = q1[4];
    }
  float acc[kMTiles][kSteps][4];  // O: rows g, g + 8 of each m-tile; columns 8·s + 2t, + 1
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int s = 0; s < kSteps; ++s) acc[mt][s][0] = acc[mt][s][1] = acc[mt][s][2] = acc[mt][s][3] = 0.0f;
  float m_row[kMTiles][2], l_row[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) m_row[mt][0] = m_row[mt][1] = -INFINITY, l_row[mt][0] = l_row[mt][1] = 0.0f;

  auto load_tile = [&](int stage, int tile) {
    float* k_tile = smem + stage * 2 * kTileFloats;
    float* v_tile = k_tile + kTileFloats;
    const float* k_src = kp + static_cast<int64_t>(tile) * kBlockN * D;
    const float* v_src = vp + static_cast<int64_t>(tile) * kBlockN * D;
    for (int chunk = threadIdx.x; chunk < kBlockN * D / 4; chunk += kWarps * 32) {
      const int r = chunk / (D / 4), c = (chunk % (D / 4)) * 4;
      cp_async16(k_tile + r * kStride + c, k_src + r * D + c);
      cp_async16(v_tile + r * kStride + c, v_src + r * D + c);
    }
  };

  if (tile_begin < tile_end) {
    load_tile(0, tile_begin);
    cp_async_commit();
  }
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = (tile - tile_begin) & 1;
    if (tile + 1 < tile_end) {
      load_tile(stage ^ 1, tile + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* k_tile = smem + stage * 2 * kTileFloats;
    const float* v_tile = k_tile + kTileFloats;

    // S = Q̃·Kᵀ for this warp's rows × kBlockN keys.
    float s_acc[kMTiles][kKeyTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) s_acc[mt][j][0] = s_acc[mt][j][1] = s_acc[mt][j][2] = s_acc[mt][j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        const float* kr = k_tile + (j * 8 + g) * kStride + s * 8 + t;
        const float b0 = kr[0], b1 = kr[4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) mma_split<kSParts>(s_acc[mt][j], qa[mt][s], b0, b1);
      }
    const int key0 = tile * kBlockN;
    float scale_old[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int row0 = warp_row0 + mt * 16;
      // Mask keys past the end (the last tile's zero padding) and, when causal, above the diagonal.
      if (key0 + kBlockN > keys || (kCausal && key0 + kBlockN - 1 > row0)) {
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int key = key0 + j * 8 + 2 * t + (r & 1);
            const int row = row0 + g + (r >= 2 ? 8 : 0);
            if (key >= keys || (kCausal && key > row)) s_acc[mt][j][r] = -INFINITY;
          }
      }
      // Online softmax: rows g (registers 0, 1) and g + 8 (2, 3); the 4 threads of a quad share a row.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
          tile_max = fmaxf(tile_max, fmaxf(s_acc[mt][j][2 * h], s_acc[mt][j][2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float m_new = fmaxf(m_row[mt][h], tile_max);
        // A row with every key so far masked keeps m = −inf; subtract 0 then (2^−inf = 0, no NaN).
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        scale_old[mt][h] = exp2f(m_row[mt][h] - m_use);
        m_row[mt][h] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = exp2f(s_acc[mt][j][2 * h + e] - m_use);
            if constexpr (kPvParts == 1) x = __uint_as_float(to_tf32(x));
            s_acc[mt][j][2 * h + e] = x;
            sum += x;
          }
        l_row[mt][h] = l_row[mt][h] * scale_old[mt][h] + sum;  // per-thread partial; the quad's sum at the end
      }
    }
    // O = O·2^(m_old − m) + P·V: k-step j of P·V is key tile j of S, keys in the order 2t ↔ column t,
    // 2t + 1 ↔ column t + 4.
#pragma unroll
    for (int c0 = 0; c0 < kSteps; c0 += kChunk) {
      float part[kMTiles][kChunk][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int s = 0; s < kChunk; ++s) part[mt][s][0] = part[mt][s][1] = part[mt][s][2] = part[mt][s][3] = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        const float* vr = v_tile + (j * 8 + 2 * t) * kStride + g;
#pragma unroll
        for (int s = 0; s < kChunk; ++s) {
          const float b0 = vr[(c0 + s) * 8], b1 = vr[kStride + (c0 + s) * 8];
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            const float pa[4] = {s_acc[mt][j][0], s_acc[mt][j][2], s_acc[mt][j][1], s_acc[mt][j][3]};
            mma_split<kPvParts>(part[mt][s], pa, b0, b1);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int s = 0; s < kChunk; ++s)
#pragma unroll
          for (int r = 0; r < 4; ++r)
            acc[mt][c0 + s][r] = fmaf(acc[mt][c0 + s][r], scale_old[mt][r / 2], part[mt][s][r]);
    }
    __syncthreads();  // the next iteration's load overwrites this stage
  }

  // Finish: the quad's row sums, then out (one split) or the partials.
  const bool single = gridDim.y == 1;
  const int64_t rows_padded = static_cast<int64_t>(gridDim.x) * kBlockM;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_row[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = warp_row0 + mt * 16 + g + 8 * h;
      const float inv = l > 0 ? 1.0f / l : 0.0f;
      if (single) {
        if (row >= n) continue;
        float* dst = out + static_cast<int64_t>(row) * pv;
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          const int c = s * 8 + 2 * t;
          if (c < pv) dst[c] = acc[mt][s][2 * h] * inv;
          if (c + 1 < pv) dst[c + 1] = acc[mt][s][2 * h + 1] * inv;
        }
      } else {
        float* dst = part_o + (split * rows_padded + row) * D;
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
          *reinterpret_cast<float2*>(dst + s * 8 + 2 * t) =
              make_float2(acc[mt][s][2 * h] * inv, acc[mt][s][2 * h + 1] * inv);
        if (t == 0) {
          part_ml[(split * rows_padded + row) * 2] = m_row[mt][h];
          part_ml[(split * rows_padded + row) * 2 + 1] = l;
        }
      }
    }
}

// out(i, c) = Σ_s w_s·O_s(i, c) / Σ_s w_s with w_s = l_s·2^(m_s − max_s m_s): the splits' softmaxes
// merged exactly (a split with no unmasked key has l = 0 and weight 0).
__global__ void combine_splits_kernel(const float* part_o, const float* part_ml, int n, int64_t rows_padded, int d,
                                      int pv, int splits, float* out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(n) * pv) return;
  const int64_t i = idx / pv;
  const int c = static_cast<int>(idx % pv);
  float m_max = -INFINITY;
  for (int s = 0; s < splits; ++s) m_max = fmaxf(m_max, part_ml[(s * rows_padded + i) * 2]);
  float numerator = 0.0f, denominator = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float l = part_ml[(s * rows_padded + i) * 2 + 1];
    if (l == 0.0f) continue;
    const float w = l * exp2f(part_ml[(s * rows_padded + i) * 2] - m_max);
    numerator += w * part_o[(s * rows_padded + i) * d + c];
    denominator += w;
  }
  out[idx] = numerator / denominator;
}

// A tile shape: kWarps warps of kMTiles × 16 rows, kBlockN keys per shared-memory tile.
template <int D, int kWarps, int kMTiles, int kBlockN, int kSParts, int kPvParts, bool kCausal>
void launch(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv, float scale,
            Scratch& scratch, float* out, cudaStream_t stream) {
  constexpr int kBlockM = 16 * kMTiles * kWarps;
  constexpr size_t kShared = 2 * 2 * kBlockN * (D + 4) * sizeof(float);
  auto kernel = flash_tc_kernel<D, kWarps, kMTiles, kBlockN, kSParts, kPvParts, kCausal>;
  static int sms = 0, blocks_per_sm = 0;
  if (sms == 0) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared),
               "cudaFuncSetAttribute(flash_tc_kernel)");
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kWarps * 32, kShared),
               "occupancy");
    blocks_per_sm = std::max(blocks_per_sm, 1);
  }
  const int64_t row_tiles = (n + kBlockM - 1) / kBlockM, key_tiles = (keys + kBlockN - 1) / kBlockN;
  const int64_t rows_padded = row_tiles * kBlockM, keys_padded = key_tiles * kBlockN;
  // Split the keys when the row tiles alone leave SMs idle, keeping at least 8 tiles per split.
  // Causal too: a row tile stops at its diagonal, so a split wholly above it does no work and
  // leaves l = 0 (weight 0 in the combine), and the longest row tile's keys are shared out.
  const int64_t resident = static_cast<int64_t>(sms) * blocks_per_sm;
  int64_t splits = std::max<int64_t>(1, std::min((resident + row_tiles - 1) / row_tiles, key_tiles / 8));
  const int64_t tiles_per_split = (key_tiles + splits - 1) / splits;
  splits = (key_tiles + tiles_per_split - 1) / tiles_per_split;

  const size_t pad_floats = (rows_padded + 2 * keys_padded) * D;
  const size_t part_floats = splits > 1 ? splits * rows_padded * (D + 2) : 0;
  float* base = static_cast<float*>(scratch.get((pad_floats + part_floats) * sizeof(float)));
  float *qp = base, *kp = qp + rows_padded * D, *vp = kp + keys_padded * D;
  float *part_o = vp + keys_padded * D, *part_ml = part_o + splits * rows_padded * D;
  pad_kernel<<<blocks_for(rows_padded * D, 256), 256, 0, stream>>>(q, n, static_cast<int>(p), rows_padded, D,
                                                                   scale * kLog2e, kSParts == 1, qp);
  pad_kernel<<<blocks_for(keys_padded * D, 256), 256, 0, stream>>>(k, keys, static_cast<int>(p), keys_padded, D, 1.0f,
                                                                   kSParts == 1, kp);
  pad_kernel<<<blocks_for(keys_padded * D, 256), 256, 0, stream>>>(v, keys, static_cast<int>(pv), keys_padded, D, 1.0f,
                                                                   kPvParts == 1, vp);
  check_cuda(cudaGetLastError(), "pad_kernel");
  kernel<<<dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(splits)), kWarps * 32, kShared, stream>>>(
      qp, kp, vp, static_cast<int>(n), static_cast<int>(keys), static_cast<int>(tiles_per_split), static_cast<int>(pv),
      out, part_o, part_ml);
  check_cuda(cudaGetLastError(), "flash_tc_kernel");
  if (splits > 1) {
    combine_splits_kernel<<<blocks_for(n * pv, 256), 256, 0, stream>>>(
        part_o, part_ml, static_cast<int>(n), rows_padded, D, static_cast<int>(pv), static_cast<int>(splits), out);
    check_cuda(cudaGetLastError(), "combine_splits_kernel");
  }
}

int g_tile_warps = 0, g_tile_mtiles = 0, g_tile_keys = 0;  // set_flash_tiles: 0 = the defaults below

template <int D, int kSParts, int kPvParts, bool kCausal>
void launch_for_dim(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                    float scale, Scratch& scratch, float* out, cudaStream_t stream) {
#define ATTNPROBE_TILE(W, M, B)                                    \
  if (g_tile_warps == W && g_tile_mtiles == M && g_tile_keys == B) \
    return launch<D, W, M, B, kSParts, kPvParts, kCausal>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
  // Benchmark-only tile shapes (TF32, non-causal), beside the defaults (docs/history/gpu-runs.md).
  if constexpr (kSParts == 1 && !kCausal) {
    if (g_tile_warps != 0) {
      if constexpr (D == 64) {
        ATTNPROBE_TILE(4, 1, 64)
        ATTNPROBE_TILE(8, 1, 64)
        ATTNPROBE_TILE(4, 2, 32)
      } else {
        ATTNPROBE_TILE(4, 1, 32)
        ATTNPROBE_TILE(8, 1, 64)
        ATTNPROBE_TILE(4, 1, 64)
      }
      throw std::runtime_error("set_flash_tiles: no kernel for this shape at head dim " + std::to_string(D));
    }
  }
#undef ATTNPROBE_TILE
  if constexpr (kSParts == 1 && D <= 64)  // 255 registers, 256 bytes spilled, yet the fastest (run 4)
    launch<D, 4, 2, 64, kSParts, kPvParts, kCausal>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
  else if constexpr (kSParts == 1)
    launch<D, 8, 1, 64, kSParts, kPvParts, kCausal>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
  else if constexpr (D <= 64)  // the split products need the registers a second m-tile would take
    launch<D, 4, 1, 64, kSParts, kPvParts, kCausal>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
  else
    launch<D, 4, 1, 32, kSParts, kPvParts, kCausal>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
}

template <int kSParts, int kPvParts, bool kCausal>
void launch_for_precision(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p,
                          int64_t pv, float scale, Scratch& scratch, float* out, cudaStream_t stream) {
  const int64_t d = std::max(p, pv);
  if (d <= 64)
    launch_for_dim<64, kSParts, kPvParts, kCausal>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
  else
    launch_for_dim<128, kSParts, kPvParts, kCausal>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
}

}  // namespace

void set_flash_tiles(int warps, int m_tiles, int block_n) {
  g_tile_warps = warps;
  g_tile_mtiles = m_tiles;
  g_tile_keys = block_n;
}

void flash_attention_tc(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                        float scale, bool causal, bool split3, Scratch& scratch, float* out, cudaStream_t stream) {
  if (std::max(p, pv) > 128)
    throw std::runtime_error("CUDA tensor-core attention supports head dims up to 128 (got " + std::to_string(p) +
                             ", " + std::to_string(pv) + ")");
  if (causal && keys != n) throw std::runtime_error("causal attention needs as many keys as queries");
  // split3 ("tf32x3"): Q·Kᵀ in 3-part splits (6 products: softmax turns a logit's absolute error
  // into the weights' relative error, so logits need fp32's own precision), P·V in 2-part (3 products).
  if (split3) {
    if (causal)
      launch_for_precision<3, 2, true>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
    else
      launch_for_precision<3, 2, false>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
  } else {
    if (causal)
      launch_for_precision<1, 1, true>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
    else
      launch_for_precision<1, 1, false>(q, k, v, n, keys, p, pv, scale, scratch, out, stream);
  }
}

}  // namespace attnprobe::gpu
