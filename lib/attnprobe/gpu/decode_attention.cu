// Exact attention for query rows at positions against a cache of keys (decode steps, the last rows of a
// slice, cross-attention, sliding windows): flash-decoding on the CUDA cores. Decode is bound by reading K
// and V once; a few rows cannot fill the GPU by rows, so the cache is split over blocks:
//   - a warp holds R query rows (4, or 8 beyond 4 rows) in registers, lane c owning columns c, c + 32, ...,
//     and walks tiles of kTileKeys keys: per key, each lane forms its columns' share of the R logits, a
//     halving reduction across the lanes leaves lane l the whole logit of row l / (32 / R), and K's rows
//     are read straight from global memory (no padded copy: one pass over K and V);
//   - per tile, online softmax in each row's owner lanes (running max m, sum l), the weights kept in shared
//     memory and read as broadcasts by the P·V products, V read like K;
//   - the block's kDecodeWarps warps take interleaved tiles of the block's key range and merge their
//     (m, l, O) in shared memory; blocks (one per key range and group of R rows; groups of one range run
//     side by side, so K and V come from memory once and from L2 for the other groups) write partials
//     that a second kernel merges per row (log-space weights l_s·e^(m_s − M)).
// Speed (lib/attnprobe/gpu/PERF.md): one to four rows run at 1.3× the time of reading K and V at 1M keys.
// Many rows are bound by the CUDA cores' arithmetic (4·p flops a key a row, ~3× the read time at 16 rows).
// A row sees keys visible_range(position) (view/mask.h): full, causal (≤ position) or window:W; a key
// outside it gets weight 0, and a tile outside every row of the warp is skipped. Rows of several query
// heads that share a kv head (grouped-query attention) are rows like any other: K and V are read once.
// Acc = float: the scale carries log2(e), so 2^x replaces e^x; Acc = double: the reference mode.
#include <algorithm>
#include <cmath>
#include <string>

#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"

namespace attnprobe::gpu {

namespace {

constexpr int kDecodeWarps = 4;  // warps per block, sharing a key range and a group of rows
// Keys per warp step, each lane keeping its row's logit of each: 16 where 16 rows (or doubles) take the registers.
template <typename Acc, int R>
constexpr int kTileKeys = R >= 16 || sizeof(Acc) == 8 ? 16 : 32;
// The fewest keys a block takes: at 65536 keys, 128 gave 1.5× the speed of 512 (more blocks in the wave,
// shorter chains per warp) and at 1M keys the same (apps/gpu_bench --decode-tuning, H200).
constexpr int64_t kMinSplitKeys = 128;
// set_decode_tuning (benchmark and tests): 0 = the defaults.
int g_rows_per_warp = 0;
int64_t g_min_split_keys = 0;
constexpr unsigned kAll = 0xffffffffu;

template <typename Acc>
__device__ __forceinline__ Acc exp_base(Acc x) {
  if constexpr (sizeof(Acc) == 4)
    return exp2f(x);
  else
    return exp(x);
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The keys [begin, end) the query at `position` sees among `keys` (view/mask.h's visible_range).
__device__ __forceinline__ void visible_keys(int64_t position, int64_t keys, int mask, int64_t window, int64_t& begin,
                                             int64_t& end) {
  begin = 0;
  end = keys;
  if (mask != static_cast<int>(KeyMask::kFull)) end = min64(position + 1, keys);
  if (mask == static_cast<int>(KeyMask::kWindow)) begin = min64(max64(position - window + 1, 0), keys);
}

// part[r] summed over the warp's lanes, for R rows at once: each halving step sends half of the values
// to the partner lane and keeps the other half, so R values cost R − 1 shuffles, not 5·R; the lanes
// that end up sharing a row then finish with full butterflies. Returns the whole sum of row
// lane / (32 / R).
template <typename Acc, int R>
__device__ __forceinline__ Acc reduce_rows(Acc (&part)[R], int lane) {
  constexpr int kHalvings = R == 16 ? 4 : R == 8 ? 3 : R == 4 ? 2 : R == 2 ? 1 : 0;
  static_assert(R == 1 << kHalvings, "R is a power of two up to 16");
#pragma unroll
  for (int step = 0; step < kHalvings; ++step) {
    const int half = R >> (step + 1), bit = 16 >> step;
    const bool upper = (lane & bit) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const Acc send = upper ? part[i] : part[i + half];
      const Acc keep = upper ? part[i + half] : part[i];
      part[i] = keep + __shfl_xor_sync(kAll, send, bit);
    }
  }
  Acc sum = part[0];
#pragma unroll
  for (int b = 32 / R / 2; b >= 1; b /= 2) sum += __shfl_xor_sync(kAll, sum, b);
  return sum;
}

// One block: rows [group·R, group·R + R) against keys [split·keys_per_split, …+keys_per_split). Partials:
// part_o (splits × rows_padded × D, unnormalised Σ weight·v) and part_ml (splits × rows_padded × 2: m, l).
template <typename Acc, int D, int R>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_kernel(const float* __restrict__ q, const int64_t* __restrict__ positions, const float* __restrict__ k,
                  const float* __restrict__ v, int rows, int64_t keys, int p, int pv, Acc scale, int mask,
                  int64_t window, int64_t keys_per_split, Acc* __restrict__ part_o, Acc* __restrict__ part_ml) {
  constexpr int kCols = D / 32;         // columns per lane
  constexpr int kLanesPerRow = 32 / R;  // lanes holding the same row's logits after reduce_rows
  constexpr int kTile = kTileKeys<Acc, R>;
  __shared__ Acc merge_ml[kDecodeWarps][R][2];
  __shared__ Acc merge_o[kDecodeWarps][R][D];
  // Each lane's logits (then weights) of the warp's current tile, column `lane`: the loops over a tile's keys
  // need not unroll (with 16 rows they do not), and the P·V step reads row r's weight as a broadcast.
  __shared__ Acc tile_weights[kDecodeWarps][kTile][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = blockIdx.x, split = blockIdx.y;
  const int64_t rows_padded = static_cast<int64_t>(gridDim.x) * R;
  const int row0 = group * R;

  // This warp's query rows, scaled, in registers; padding rows are zero and see no key.
  Acc qr[R][kCols];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int s = 0; s < kCols; ++s) {
      const int c = lane + 32 * s;
      qr[r][s] = row0 + r < rows && c < p ? static_cast<Acc>(q[static_cast<int64_t>(row0 + r) * p + c]) * scale
                                          : static_cast<Acc>(0);
    }
  // The keys of the row this lane owns, and the union over the warp's rows (tiles outside it are skipped).
  const int my_row = lane / kLanesPerRow;
  int64_t my_begin = 0, my_end = 0;
  if (row0 + my_row < rows) visible_keys(positions[row0 + my_row], keys, mask, window, my_begin, my_end);
  int64_t union_begin = my_end > my_begin ? my_begin : keys, union_end = my_end;
#pragma unroll
  for (int b = 16; b >= 1; b /= 2) {
    union_begin = min64(union_begin, __shfl_xor_sync(kAll, union_begin, b));
    union_end = max64(union_end, __shfl_xor_sync(kAll, union_end, b));
  }
  const int64_t split_begin = split * keys_per_split, split_end = min64(keys, split_begin + keys_per_split);
  const int64_t begin = max64(split_begin, union_begin), end = min64(split_end, union_end);

  Acc acc[R][kCols];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int s = 0; s < kCols; ++s) acc[r][s] = 0;
  Acc m = -INFINITY, l = 0;  // of my_row
  // Tiles are aligned to the split's start, warps interleaved, so every warp's tiles are whole key runs.
  const int64_t first_tile = begin <= split_begin ? 0 : (begin - split_begin) / kTile;
  for (int64_t t0 = split_begin + (first_tile + warp) * kTile; t0 < end; t0 += kDecodeWarps * kTile) {
    Acc(&weights)[kTile][32] = tile_weights[warp];
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      const int64_t key = t0 + j;
      // Keys past `end` read the last one (no branch keeps the loads from being issued early) and weigh 0.
      const float* k_row = k + min64(key, end - 1) * p;
      Acc part[R];
#pragma unroll
      for (int r = 0; r < R; ++r) part[r] = 0;
#pragma unroll
      for (int s = 0; s < kCols; ++s) {
        const int c = lane + 32 * s;
        const Acc kc = c < p ? static_cast<Acc>(__ldg(k_row + c)) : static_cast<Acc>(0);
#pragma unroll
        for (int r = 0; r < R; ++r) part[r] += qr[r][s] * kc;
      }
      const Acc sum = reduce_rows<Acc, R>(part, lane);  // every lane takes part in the shuffles
      weights[j][lane] = key < end && key >= my_begin && key < my_end ? sum : static_cast<Acc>(-INFINITY);
    }
    Acc tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j) tile_max = max(tile_max, weights[j][lane]);
    const Acc m_new = max(m, tile_max);
    const Acc shift = m_new == static_cast<Acc>(-INFINITY) ? static_cast<Acc>(0) : m_new;  // no −inf − (−inf)
    const Acc correction = exp_base(m - shift);  // 0 while the row has seen no key
    Acc tile_sum = 0;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const Acc weight = exp_base(weights[j][lane] - shift);
      weights[j][lane] = weight;
      tile_sum += weight;
    }
    l = l * correction + tile_sum;
    m = m_new;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const Acc row_correction = __shfl_sync(kAll, correction, r * kLanesPerRow);
#pragma unroll
      for (int s = 0; s < kCols; ++s) acc[r][s] *= row_correction;
    }
    __syncwarp();  // every lane's weights are written
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      const float* v_row = v + min64(t0 + j, end - 1) * pv;  // a key past `end` has weight 0
      Acc vc[kCols];
#pragma unroll
      for (int s = 0; s < kCols; ++s) {
        const int c = lane + 32 * s;
        vc[s] = c < pv ? static_cast<Acc>(__ldg(v_row + c)) : static_cast<Acc>(0);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const Acc w = weights[j][r * kLanesPerRow];
#pragma unroll
        for (int s = 0; s < kCols; ++s) acc[r][s] += w * vc[s];
      }
    }
    __syncwarp();  // the weights are read before the next tile's logits overwrite them
  }

  // Merge the block's warps: each row's max over the warps, then every warp's share rescaled to it.
  if (lane % kLanesPerRow == 0) {
    merge_ml[warp][my_row][0] = m;
    merge_ml[warp][my_row][1] = l;
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int s = 0; s < kCols; ++s) merge_o[warp][r][lane + 32 * s] = acc[r][s];
  __syncthreads();
  for (int e = threadIdx.x; e < R * D; e += blockDim.x) {
    const int r = e / D, c = e % D;
    Acc m_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) m_max = max(m_max, merge_ml[w][r][0]);
    Acc o = 0, l_sum = 0;
    if (m_max != static_cast<Acc>(-INFINITY))
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        if (merge_ml[w][r][0] == static_cast<Acc>(-INFINITY)) continue;
        const Acc weight = exp_base(merge_ml[w][r][0] - m_max);
        o += weight * merge_o[w][r][c];
        l_sum += weight * merge_ml[w][r][1];
      }
    const int64_t slot = split * rows_padded + row0 + r;
    part_o[slot * D + c] = o;
    if (c == 0) {
      part_ml[slot * 2] = m_max;
      part_ml[slot * 2 + 1] = l_sum;
    }
  }
}

// out(i, c) = Σ_s O_s(i, c)·e^(m_s − M) / Σ_s l_s·e^(m_s − M), M = max_s m_s: a block per row and 32 columns,
// its warps taking interleaved splits, then summed in shared memory.
template <typename Acc>
__global__ void __launch_bounds__(256)
    combine_decode_kernel(const Acc* __restrict__ part_o, const Acc* __restrict__ part_ml, int64_t rows_padded, int d,
                          int pv, int splits, float* __restrict__ out) {
  constexpr int kWarps = 8;
  __shared__ Acc partial_max[kWarps], numerators[kWarps][32], denominators[kWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;
  const int c = blockIdx.y * 32 + lane;
  Acc m_max = -INFINITY;
  for (int s = warp * 32 + lane; s < splits; s += kWarps * 32) m_max = max(m_max, part_ml[(s * rows_padded + row) * 2]);
#pragma unroll
  for (int b = 16; b >= 1; b /= 2) m_max = max(m_max, __shfl_xor_sync(kAll, m_max, b));
  if (lane == 0) partial_max[warp] = m_max;
  __syncthreads();
  m_max = partial_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m_max = max(m_max, partial_max[w]);
  Acc numerator = 0, denominator = 0;
  for (int s = warp; s < splits; s += kWarps) {
    const int64_t slot = s * rows_padded + row;
    const Acc m = part_ml[slot * 2];
    if (m == static_cast<Acc>(-INFINITY)) continue;  // a split that saw no key of this row
    const Acc weight = exp_base(m - m_max);
    denominator += weight * part_ml[slot * 2 + 1];
    if (c < pv) numerator += weight * part_o[slot * d + c];
  }
  numerators[warp][lane] = numerator;
  denominators[warp][lane] = denominator;
  __syncthreads();
  if (warp == 0 && c < pv) {
    Acc num = 0, den = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) num += numerators[w][lane], den += denominators[w][lane];
    out[row * pv + c] = static_cast<float>(num / den);
  }
}

template <typename Acc, int D, int R>
void launch_decode(const float* q, const int64_t* positions, const float* k, const float* v, int64_t rows, int64_t keys,
                   int64_t p, int64_t pv, Acc scale, KeyMask mask, int64_t window, Scratch& scratch, float* out,
                   cudaStream_t stream) {
  auto kernel = decode_kernel<Acc, D, R>;
  static int resident = 0;  // blocks the GPU holds at once
  if (resident == 0) {
    int device = 0, sms = 0, per_sm = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kDecodeWarps * 32, 0), "occupancy");
    resident = sms * std::max(per_sm, 1);
  }
  const int64_t groups = (rows + R - 1) / R, rows_padded = groups * R;
  // One wave of blocks: the key ranges of a group of rows fill what the other groups leave (more splits
  // would only add partials for the combine to read).
  const int64_t wanted = std::max<int64_t>(1, resident / groups);
  const int64_t most = std::max<int64_t>(1, keys / (g_min_split_keys > 0 ? g_min_split_keys : kMinSplitKeys));
  int64_t splits = std::min(wanted, most);
  int64_t keys_per_split = (keys + splits - 1) / splits;
  keys_per_split = (keys_per_split + kTileKeys<Acc, R> - 1) / kTileKeys<Acc, R> * kTileKeys<Acc, R>;
  splits = (keys + keys_per_split - 1) / keys_per_split;
  if (splits > 65535)
    throw std::runtime_error("decode attention: " + std::to_string(rows) + " rows × " + std::to_string(keys) +
                             " keys is beyond the kernel's grid");
  const size_t part_count = static_cast<size_t>(splits * rows_padded);
  Acc* part_o = static_cast<Acc*>(scratch.get(part_count * (D + 2) * sizeof(Acc)));
  Acc* part_ml = part_o + part_count * D;
  kernel<<<dim3(static_cast<unsigned>(groups), static_cast<unsigned>(splits)), kDecodeWarps * 32, 0, stream>>>(
      q, positions, k, v, static_cast<int>(rows), keys, static_cast<int>(p), static_cast<int>(pv), scale,
      static_cast<int>(mask), window, keys_per_split, part_o, part_ml);
  check_cuda(cudaGetLastError(), "decode_kernel");
  combine_decode_kernel<Acc>
      <<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>((pv + 31) / 32)), 256, 0, stream>>>(
          part_o, part_ml, rows_padded, D, static_cast<int>(pv), static_cast<int>(splits), out);
  check_cuda(cudaGetLastError(), "combine_decode_kernel");
}

template <typename Acc, int R>
void launch_decode_for_dim(const float* q, const int64_t* positions, const float* k, const float* v, int64_t rows,
                           int64_t keys, int64_t p, int64_t pv, Acc scale, KeyMask mask, int64_t window,
                           Scratch& scratch, float* out, cudaStream_t stream) {
  if (std::max(p, pv) <= 64)
    launch_decode<Acc, 64, R>(q, positions, k, v, rows, keys, p, pv, scale, mask, window, scratch, out, stream);
  else
    launch_decode<Acc, 128, R>(q, positions, k, v, rows, keys, p, pv, scale, mask, window, scratch, out, stream);
}

}  // namespace

void set_decode_tuning(int rows_per_warp, int64_t min_split_keys) {
  if (rows_per_warp != 0 && rows_per_warp != 4 && rows_per_warp != 8 && rows_per_warp != 16)
    throw std::runtime_error("set_decode_tuning: rows per warp 0, 4, 8 or 16");
  g_rows_per_warp = rows_per_warp;
  g_min_split_keys = min_split_keys;
}

void decode_attention_device(const float* q, const int64_t* positions, const float* k, const float* v, int64_t rows,
                             int64_t keys, int64_t p, int64_t pv, float scale, KeyMask mask, int64_t window, bool fp64,
                             Scratch& scratch, float* out, cudaStream_t stream) {
  if (p > 128 || pv > 128)
    throw InputError("CUDA decode attention supports head dims up to 128 (got " + std::to_string(p) + ", " +
                     std::to_string(pv) + ")");
  if (rows <= 0 || keys <= 0) throw std::runtime_error("decode attention needs at least one row and one key");
  if (fp64) {
    // The reference mode: 4 rows a warp keep the double registers in bounds.
    launch_decode_for_dim<double, 4>(q, positions, k, v, rows, keys, p, pv, static_cast<double>(scale), mask, window,
                                     scratch, out, stream);
    return;
  }
  const float scale2 = scale * 1.4426950408889634f;  // 2^x replaces e^x
  // Rows a warp: 8 beyond 4 rows. At 16 and 64 rows against 262144-1M keys, 8 ran 1.3-1.6× faster than 4 (half
  // the warps re-reading K and V through L2) and 1.8-2.0× faster than 16 (203 registers: 8 warps an SM hide
  // too little latency); apps/gpu_bench --decode-tuning, H200.
  const int per_warp = g_rows_per_warp != 0 ? g_rows_per_warp : rows <= 4 ? 4 : 8;
  if (per_warp == 4)
    launch_decode_for_dim<float, 4>(q, positions, k, v, rows, keys, p, pv, scale2, mask, window, scratch, out, stream);
  else if (per_warp == 8)
    launch_decode_for_dim<float, 8>(q, positions, k, v, rows, keys, p, pv, scale2, mask, window, scratch, out, stream);
  else
    launch_decode_for_dim<float, 16>(q, positions, k, v, rows, keys, p, pv, scale2, mask, window, scratch, out, stream);
}

void decode_attention(const float* q, const int64_t* positions, const float* k, const float* v, int64_t rows,
                      int64_t keys, int64_t p, int64_t pv, float scale, KeyMask mask, int64_t window, bool fp64,
                      float* out) {
  DeviceBuffer<float> dq(q, rows * p), dk(k, keys * p), dv(v, keys * pv), dout(rows * pv);
  DeviceBuffer<int64_t> dpositions(positions, rows);
  thread_local Scratch scratch;  // the split partials, kept between calls; one per calling thread
  decode_attention_device(dq.get(), dpositions.get(), dk.get(), dv.get(), rows, keys, p, pv, scale, mask, window, fp64,
                          scratch, dout.get(), nullptr);
  check_launch("decode_attention");
  dout.download(out);
}

}  // namespace attnprobe::gpu
