// Exact attention on the GPU (mirrors exact/exact_attention.cpp), in four precisions
// (AttentionPrecision): the tensor-core kernels of flash_attention_tc.cu (TF32, and 3×TF32 for
// fp32-level error), and here the simple flash-style kernel, one thread per query row, keys and
// values staged through shared memory in tiles, online softmax (running max m, sum l, output
// rescaled by exp(m_old − m_new)), so the n × keys matrix is never formed. Acc = double is the
// fp64-accumulation reference mode; Acc = float sums every key in sequence, so its error grows with
// the number of keys (1.3e-6 at n = 4096 on the H100 against 1.4e-7 for the CPU's blocked float32).
#include <cmath>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/flash_attention_tc.h"
#include "attnprobe/gpu/kernels.h"

namespace attnprobe::gpu {

namespace {
constexpr int kMaxDim = 128;   // per-thread query and accumulator arrays
constexpr int kKeyTile = 32;   // keys per shared-memory tile: 32 × (128 + 128) floats = 32 KiB
constexpr int kThreads = 128;  // query rows per block

template <typename Acc>
__global__ void flash_attention_kernel(const float* q, const float* k, const float* v, int n, int keys, int p, int pv,
                                       float scale, bool causal, float* out) {
  extern __shared__ float tile[];
  float* k_tile = tile;
  float* v_tile = tile + kKeyTile * p;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = i < n;
  Acc query[kMaxDim], acc[kMaxDim];
  Acc running_max = -INFINITY, running_sum = 0;
  for (int c = 0; c < pv; ++c) acc[c] = 0;
  if (active)
    for (int c = 0; c < p; ++c)
      query[c] = static_cast<Acc>(q[static_cast<int64_t>(i) * p + c]) * static_cast<Acc>(scale);
  for (int t0 = 0; t0 < keys; t0 += kKeyTile) {
    const int rows = min(kKeyTile, keys - t0);
    for (int idx = threadIdx.x; idx < rows * p; idx += blockDim.x) k_tile[idx] = k[static_cast<int64_t>(t0) * p + idx];
    for (int idx = threadIdx.x; idx < rows * pv; idx += blockDim.x)
      v_tile[idx] = v[static_cast<int64_t>(t0) * pv + idx];
    __syncthreads();
    if (active) {
      const int last = causal ? min(rows, i - t0 + 1) : rows;  // causal: keys j ≤ i only
      for (int j = 0; j < last; ++j) {
        Acc logit = 0;
        for (int c = 0; c < p; ++c) logit += query[c] * static_cast<Acc>(k_tile[j * p + c]);
        if (logit > running_max) {
          const Acc correction = exp(running_max - logit);  // 0 on the first key
          running_sum *= correction;
          for (int c = 0; c < pv; ++c) acc[c] *= correction;
          running_max = logit;
        }
        const Acc weight = exp(logit - running_max);
        running_sum += weight;
        for (int c = 0; c < pv; ++c) acc[c] += weight * static_cast<Acc>(v_tile[j * pv + c]);
      }
    }
    __syncthreads();
  }
  if (active)
    for (int c = 0; c < pv; ++c) out[static_cast<int64_t>(i) * pv + c] = static_cast<float>(acc[c] / running_sum);
}
}  // namespace

const char* precision_name(AttentionPrecision precision) {
  switch (precision) {
    case AttentionPrecision::kFp64:
      return "fp64";
    case AttentionPrecision::kFp32:
      return "fp32";
    case AttentionPrecision::kTf32x3:
      return "tf32x3";
    case AttentionPrecision::kTf32:
      return "tf32";
  }
  return "?";
}

Scratch::~Scratch() {
  if (data_) cudaFree(data_);
}

void* Scratch::get(size_t bytes) {
  if (bytes > bytes_) {
    if (data_) check_cuda(cudaFree(data_), "cudaFree");
    data_ = nullptr;
    bytes_ = 0;
    check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc(scratch)");
    bytes_ = bytes;
  }
  return data_;
}

void exact_attention_device(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p,
                            int64_t pv, float scale, bool causal, AttentionPrecision precision, Scratch& scratch,
                            float* out, cudaStream_t stream) {
  if (p > kMaxDim || pv > kMaxDim)
    throw InputError("CUDA exact attention supports head dims up to 128 (got " + std::to_string(p) + ", " +
                     std::to_string(pv) + ")");
  if (causal && keys != n) throw std::runtime_error("causal attention needs as many keys as queries");
  if (precision == AttentionPrecision::kTf32 || precision == AttentionPrecision::kTf32x3) {
    flash_attention_tc(q, k, v, n, keys, p, pv, scale, causal, precision == AttentionPrecision::kTf32x3, scratch, out,
                       stream);
    return;
  }
  const size_t shared = static_cast<size_t>(kKeyTile) * (p + pv) * sizeof(float);
  const int ni = static_cast<int>(n), ki = static_cast<int>(keys), pi = static_cast<int>(p), pvi = static_cast<int>(pv);
  if (precision == AttentionPrecision::kFp64)
    flash_attention_kernel<double>
        <<<blocks_for(n, kThreads), kThreads, shared, stream>>>(q, k, v, ni, ki, pi, pvi, scale, causal, out);
  else
    flash_attention_kernel<float>
        <<<blocks_for(n, kThreads), kThreads, shared, stream>>>(q, k, v, ni, ki, pi, pvi, scale, causal, out);
  check_cuda(cudaGetLastError(), "flash_attention_kernel");
}

void exact_attention(const float* q, const float* k, const float* v, int64_t n, int64_t keys, int64_t p, int64_t pv,
                     float scale, AttentionPrecision precision, bool causal, float* out) {
  DeviceBuffer<float> dq(q, n * p), dk(k, keys * p), dv(v, keys * pv), dout(n * pv);
  thread_local Scratch scratch;  // kept between calls (padded copies, split partials); one per calling thread
  exact_attention_device(dq.get(), dk.get(), dv.get(), n, keys, p, pv, scale, causal, precision, scratch, dout.get(),
                         nullptr);
  check_launch("exact_attention");
  dout.download(out);
}

}  // namespace attnprobe::gpu

// The CUDA version of `softmax` (estimators/exact/softmax.cpp): 3×TF32 on the tensor cores, fp32-level
// error (the parity test holds it to twice the CPU's), where the simple fp32 kernel's sequential sums
// err 9× the CPU's at n = 4096 (PERF.md). Causal form: the kernels' own (tiles above the diagonal skipped).
namespace attnprobe::gpu {
namespace {

class CudaSoftmax final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out.resize(view.n(), view.pv());
    exact_attention(view.qf.data(), view.kf.data(), view.vf.data(), view.n(), view.kf.rows(), view.p(), view.pv(),
                    static_cast<float>(view.scale), AttentionPrecision::kTf32x3, view.mask == Mask::kCausal,
                    out.data());
  }
  // The float64 reference on the device (`sweep --device cuda`): the fp64-accumulation kernel on the
  // float32 inputs, rounded to float at the end (the dumps are float32; the parity test holds it
  // within 1e-6 of the CPU's float64 path). n × pv.
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override {
    MatrixF out(view.n(), view.pv());
    exact_attention(view.qf.data(), view.kf.data(), view.vf.data(), view.n(), view.kf.rows(), view.p(), view.pv(),
                    static_cast<float>(view.scale), AttentionPrecision::kFp64, view.mask == Mask::kCausal, out.data());
    return out.cast<double>();
  }
  double flops(int64_t n, int64_t p, int64_t pv) const override { return 2.0 * n * n * (p + pv); }
};

[[maybe_unused]] const bool kOnCuda = register_implementation(
    "softmax", Device::kCuda, [](const Spec&) { return std::make_unique<CudaSoftmax>(); }, CausalForm::kYes);

}  // namespace
}  // namespace attnprobe::gpu
