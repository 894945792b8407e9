// Informer (ProbSparse) on the GPU (mirrors informer.cpp): the u exact rows on the tensor cores (3×TF32,
// O(u·n·p)) and mean(V) for the others (float64 sums). The host adapter (informer_cuda.cpp) picks the rows.
#include "attnprobe/estimators/sketching/informer/informer_cuda_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/sketch_kernels.cuh"

namespace attnprobe::gpu {
namespace {

// out (n × pv): row active[r] = rows(r) for r < u (rows: u × pv), every other row already mean(V).
__global__ void scatter_rows_kernel(const float* rows, const int32_t* active, int64_t u, int pv, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= u * pv) return;
  out[static_cast<int64_t>(active[idx / pv]) * pv + idx % pv] = rows[idx];
}

}  // namespace

void informer_cuda(const InformerCudaParams& params) {
  const int64_t n = params.n, keys = params.keys, p = params.p, pv = params.pv, u = params.u;
  DeviceBuffer<float> dq(params.q, n * p), dk(params.k, keys * p), dv(params.v, keys * pv), dq_active(u * p),
      drows(u * pv), dout(n * pv);
  DeviceBuffer<int32_t> dactive(params.active, u);
  thread_local Scratch scratch, mean_scratch;
  gather_rows(dq.get(), dactive.get(), u, p, dq_active.get());
  exact_attention_device(dq_active.get(), dk.get(), dv.get(), u, keys, p, pv, params.scale, false,
                         AttentionPrecision::kTf32x3, scratch, drows.get());
  vmean_device(dv.get(), n, keys, pv, mean_scratch, dout.get());
  scatter_rows_kernel<<<blocks_for(u * pv, 256), 256>>>(drows.get(), dactive.get(), u, static_cast<int>(pv),
                                                        dout.get());
  check_launch("informer");
  dout.download(params.out);
}

}  // namespace attnprobe::gpu
