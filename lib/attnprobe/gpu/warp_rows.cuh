#pragma once
// The shared-memory staging of the warp-per-row kernels (exact_attention.cu's CUDA-core attention,
// yoso.cu's expectation): a block holds kWarpRows query rows, one per warp, and walks the keys in
// tiles of kWarpRowKeys, one key per lane. Rows and columns past the data are staged as 0, so every
// loop runs over the padded width D (a multiple of 32 ≥ the head dims).
#include <cstdint>

namespace attnprobe::gpu {

constexpr int kWarpRows = 8;      // query rows per block (one per warp), sharing each K/V tile
constexpr int kWarpRowKeys = 32;  // keys per tile: one per lane

template <int D>
struct WarpRowTiles {
  static constexpr int kKeyStride = D + 1;  // lane j reads key row j: an odd stride puts the lanes in 32 banks
  float keys[kWarpRowKeys * kKeyStride];
  float values[kWarpRowKeys * D];
  float queries[kWarpRows][D];

  // The block's query rows row0..row0 + kWarpRows − 1 of q (n × p).
  __device__ void stage_queries(const float* q, int row0, int n, int p) {
    for (int idx = threadIdx.x; idx < kWarpRows * D; idx += blockDim.x) {
      const int r = idx / D, c = idx % D;
      queries[r][c] = row0 + r < n && c < p ? q[static_cast<int64_t>(row0 + r) * p + c] : 0.0f;
    }
  }
  // Keys and values t0..t0 + kWarpRowKeys − 1 of k (keys × p) and v (keys × pv).
  __device__ void stage_keys(const float* k, const float* v, int t0, int count, int p, int pv) {
    for (int idx = threadIdx.x; idx < kWarpRowKeys * D; idx += blockDim.x) {
      const int j = idx / D, c = idx % D;
      const bool in = t0 + j < count;
      keys[j * kKeyStride + c] = in && c < p ? k[static_cast<int64_t>(t0 + j) * p + c] : 0.0f;
      values[j * D + c] = in && c < pv ? v[static_cast<int64_t>(t0 + j) * pv + c] : 0.0f;
    }
  }
  // Σ_c queries[row][c]·keys[key][c] over the padded width, accumulated in Acc.
  template <typename Acc>
  __device__ Acc dot(int row, int key) const {
    Acc sum = 0;
#pragma unroll 16
    for (int c = 0; c < D; ++c) sum += static_cast<Acc>(queries[row][c]) * static_cast<Acc>(keys[key * kKeyStride + c]);
    return sum;
  }
};

}  // namespace attnprobe::gpu
