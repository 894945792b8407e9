// Linformer and linformer-jlt on the GPU (mirror estimators/sketching/linformer.cpp). The Gaussian
// projection is drawn on the host by the CPU's own gaussian_matrix() and uploaded, so both devices
// use the same E (or S); the products run with float64 sums (sketch_kernels.cuh), the attention on
// the tensor cores in 3×TF32 (fp32-level error, as the CUDA softmax).
//  - linformer:     out = softmax(s·Q(EK)ᵀ)·(EV), E: d × n. Cost O(n·d·(p + pv)) products + O(n·d·p) attention.
//  - linformer-jlt: out = softmax(s·QKᵀ)·(S·(SᵀV)), S: n × d. Cost O(n·d·pv) + O(n²·p) attention.
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/linformer_params.h"
#include "attnprobe/gpu/cuda_check.cuh"
#include "attnprobe/gpu/device_kernels.h"
#include "attnprobe/gpu/sketch_kernels.cuh"

namespace attnprobe::gpu {
namespace {

class CudaLinformer final : public Estimator {
 public:
  explicit CudaLinformer(LinformerParams params) : params_(params) {}

  // out: n × pv. Uploads Q, K, V and E (d × n); EK (d × p) and EV (d × pv) stay on the device.
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), keys = view.kf.rows(), p = view.p(), pv = view.pv(), d = params_.d;
    const MatrixF e = gaussian_matrix(d, keys, params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection));
    DeviceBuffer<float> dq(view.qf.data(), n * p), dk(view.kf.data(), keys * p), dv(view.vf.data(), keys * pv),
        de(e.data(), d * keys), dek(d * p), dev(d * pv), dout(n * pv);
    strided_product(de.get(), keys, 1, dk.get(), d, p, keys, dek.get());
    strided_product(de.get(), keys, 1, dv.get(), d, pv, keys, dev.get());
    thread_local Scratch scratch;
    exact_attention_device(dq.get(), dek.get(), dev.get(), n, d, p, pv, static_cast<float>(view.scale), false,
                           AttentionPrecision::kTf32x3, scratch, dout.get());
    check_launch("linformer");
    out.resize(n, pv);
    dout.download(out.data());
  }

 private:
  LinformerParams params_;
};

class CudaLinformerJlt final : public Estimator {
 public:
  explicit CudaLinformerJlt(LinformerParams params) : params_(params) {}

  // out: n × pv. Uploads Q, K, V and S (keys × d); SᵀV (d × pv) and S·SᵀV (keys × pv) stay on the device.
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), keys = view.kf.rows(), p = view.p(), pv = view.pv(), d = params_.d;
    const MatrixF s = gaussian_matrix(keys, d, params_.effective_stddev(), RandomStream(ctx.key, Purpose::kProjection));
    DeviceBuffer<float> dq(view.qf.data(), n * p), dk(view.kf.data(), keys * p), dv(view.vf.data(), keys * pv),
        ds(s.data(), keys * d), dstv(d * pv), dsketch(keys * pv), dout(n * pv);
    strided_product(ds.get(), 1, d, dv.get(), d, pv, keys, dstv.get());       // Sᵀ·V: A(r, t) = S(t, r)
    strided_product(ds.get(), d, 1, dstv.get(), keys, pv, d, dsketch.get());  // S·(SᵀV)
    thread_local Scratch scratch;
    exact_attention_device(dq.get(), dk.get(), dsketch.get(), n, keys, p, pv, static_cast<float>(view.scale), false,
                           AttentionPrecision::kTf32x3, scratch, dout.get());
    check_launch("linformer-jlt");
    out.resize(n, pv);
    dout.download(out.data());
  }

 private:
  LinformerParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation("linformer", Device::kCuda, [](const Spec& spec) {
  return std::make_unique<CudaLinformer>(LinformerParams::from_spec(spec));
});
[[maybe_unused]] const bool kJltOnCuda = register_implementation("linformer-jlt", Device::kCuda, [](const Spec& spec) {
  return std::make_unique<CudaLinformerJlt>(LinformerParams::from_spec(spec));
});

}  // namespace
}  // namespace attnprobe::gpu
