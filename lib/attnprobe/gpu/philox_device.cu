// The keyed Philox stream on the device: the same header as the host (rng/philox.h,
// rng/random_stream.h), so the GPU draws exactly the CPU's numbers.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "attnprobe/gpu/device.h"

namespace attnprobe::gpu {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

__global__ void philox_words_kernel(RandomStream stream, uint32_t b, uint32_t c, int word, int64_t count,
                                    uint32_t* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = stream.bits(static_cast<uint32_t>(i), b, c).v[word];
}

__global__ void normals_kernel(RandomStream stream, uint32_t t, uint32_t c, int64_t count, double* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = stream.normal(static_cast<uint32_t>(i), t, c);
}

template <typename T, typename Launch>
std::vector<T> run(int64_t count, Launch launch) {
  std::vector<T> host(count);
  T* device = nullptr;
  check(cudaMalloc(&device, count * sizeof(T)), "cudaMalloc");
  const int threads = 256;
  const int blocks = static_cast<int>((count + threads - 1) / threads);
  launch(blocks, threads, device);
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) status = cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(device);
  check(status, "kernel");
  return host;
}

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::string device_description() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device visible";
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  return prop.name;
}

std::vector<uint32_t> philox_words(RandomKey key, Purpose purpose, uint32_t b, uint32_t c, int word, int64_t count) {
  const RandomStream stream(key, purpose);
  return run<uint32_t>(count, [&](int blocks, int threads, uint32_t* out) {
    philox_words_kernel<<<blocks, threads>>>(stream, b, c, word, count, out);
  });
}

std::vector<double> normals(RandomKey key, Purpose purpose, uint32_t t, uint32_t c, int64_t count) {
  const RandomStream stream(key, purpose);
  return run<double>(count, [&](int blocks, int threads, double* out) {
    normals_kernel<<<blocks, threads>>>(stream, t, c, count, out);
  });
}

}  // namespace attnprobe::gpu
