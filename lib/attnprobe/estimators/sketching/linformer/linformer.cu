// Linformer on the GPU (mirrors linformer.cpp): out = softmax(s·Q(EK)ᵀ)·(EV), E: d × keys drawn on the host
// (linformer_cuda.cpp). The products run with float64 sums (sketch_kernels.cuh), the attention on the
// tensor cores in 3×TF32 (fp32-level error, as the CUDA softmax). Cost O(keys·d·(p + pv)) products + O(n·d·p)
// attention. EK (d × p) and EV (d × pv) stay on the device.
#include "attnprobe/estimators/sketching/linformer/linformer_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/sketch_kernels.cuh"

namespace attnprobe::gpu {

void linformer_cuda(const LinformerCudaParams& params) {
  const int64_t n = params.n, keys = params.keys, p = params.p, pv = params.pv, d = params.d;
  DeviceBuffer<float> dq(params.q, n * p), dk(params.k, keys * p), dv(params.v, keys * pv), de(params.e, d * keys),
      dek(d * p), dev(d * pv), dout(n * pv);
  strided_product(de.get(), keys, 1, dk.get(), d, p, keys, dek.get());
  strided_product(de.get(), keys, 1, dv.get(), d, pv, keys, dev.get());
  thread_local Scratch scratch;
  exact_attention_device(dq.get(), dek.get(), dev.get(), n, d, p, pv, params.scale, false, AttentionPrecision::kTf32x3,
                         scratch, dout.get());
  check_launch("linformer");
  dout.download(params.out);
}

}  // namespace attnprobe::gpu
