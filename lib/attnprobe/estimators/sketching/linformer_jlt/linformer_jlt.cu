// linformer-jlt on the GPU (mirrors linformer_jlt.cpp): out = softmax(s·QKᵀ)·(S·(SᵀV)), S: keys × d drawn
// on the host (linformer_jlt_cuda.cpp). Products with float64 sums (sketch_kernels.cuh), attention on the
// tensor cores in 3×TF32. Cost O(keys·d·pv) + O(n·keys·p). SᵀV (d × pv) and S·SᵀV (keys × pv) stay on the device.
#include "attnprobe/estimators/sketching/linformer_jlt/linformer_jlt_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/sketch_kernels.cuh"

namespace attnprobe::gpu {

void linformer_jlt_cuda(const LinformerJltCudaParams& params) {
  const int64_t n = params.n, keys = params.keys, p = params.p, pv = params.pv, d = params.d;
  DeviceBuffer<float> dq(params.q, n * p), dk(params.k, keys * p), dv(params.v, keys * pv), ds(params.s, keys * d),
      dstv(d * pv), dsketch(keys * pv), dout(n * pv);
  strided_product(ds.get(), 1, d, dv.get(), d, pv, keys, dstv.get());       // Sᵀ·V: A(r, t) = S(t, r)
  strided_product(ds.get(), d, 1, dstv.get(), keys, pv, d, dsketch.get());  // S·(SᵀV)
  thread_local Scratch scratch;
  exact_attention_device(dq.get(), dk.get(), dsketch.get(), n, keys, p, pv, params.scale, false,
                         AttentionPrecision::kTf32x3, scratch, dout.get());
  check_launch("linformer-jlt");
  dout.download(params.out);
}

}  // namespace attnprobe::gpu
