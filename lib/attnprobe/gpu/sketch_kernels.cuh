#pragma once
// Small kernels shared by the sketching estimators' CUDA versions (linformer.cu, informer.cu,
// skeinformer.cu): a strided product with float64 accumulation and row gathers. They favour
// agreement with the CPU (float64 sums, then one rounding) over speed: each output element is one
// thread's sequential sum. Internal linkage, so each .cu holds its own copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attnprobe/gpu/cuda_check.cuh"

namespace attnprobe::gpu {
namespace {

constexpr int kProductThreads = 128;

// c (rows × cols, row-major) = A·B with A(r, t) = a[r·a_row + t·a_col] (so Aᵀ is the same array
// with the strides swapped) and B(t, c) = b[t·cols + c] (inner × cols, row-major); float64 sums.
// Grid: x over columns, y over rows (strided past 65535). Cost rows·cols·inner FMAs.
__global__ void strided_product_kernel(const float* a, int64_t a_row, int64_t a_col, const float* b, int rows, int cols,
                                       int64_t inner, float* c) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {  // gridDim.y is at most 65535
    const float* a_r = a + row * a_row;
    double sum = 0;
    for (int64_t t = 0; t < inner; ++t)
      sum += static_cast<double>(a_r[t * a_col]) * static_cast<double>(b[t * cols + col]);
    c[row * cols + col] = static_cast<float>(sum);
  }
}

inline void strided_product(const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t rows, int64_t cols,
                            int64_t inner, float* c, cudaStream_t stream = nullptr) {
  const dim3 grid(blocks_for(cols, kProductThreads), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  strided_product_kernel<<<grid, kProductThreads, 0, stream>>>(a, a_row, a_col, b, static_cast<int>(rows),
                                                               static_cast<int>(cols), inner, c);
  check_cuda(cudaGetLastError(), "strided_product_kernel");
}

// out (count × cols) = rows index[0..count) of x (· × cols, row-major).
__global__ void gather_rows_kernel(const float* x, const int32_t* index, int64_t count, int cols, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= count * cols) return;
  out[idx] = x[static_cast<int64_t>(index[idx / cols]) * cols + idx % cols];
}

inline void gather_rows(const float* x, const int32_t* index, int64_t count, int64_t cols, float* out,
                        cudaStream_t stream = nullptr) {
  gather_rows_kernel<<<blocks_for(count * cols, 256), 256, 0, stream>>>(x, index, count, static_cast<int>(cols), out);
  check_cuda(cudaGetLastError(), "gather_rows_kernel");
}

}  // namespace
}  // namespace attnprobe::gpu
