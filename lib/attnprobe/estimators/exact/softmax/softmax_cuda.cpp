#include "attnprobe/estimators/exact/softmax/softmax.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/gpu/kernels.h"

// The CUDA version of `softmax` (softmax.cpp): 3×TF32 on the tensor cores, fp32-level error (the
// conformance harness holds it to twice the CPU's), where the simple fp32 kernel's sequential sums err 9×
// the CPU's at n = 4096 (docs/history/gpu-runs.md, run 1). Causal form: the kernels' own (tiles above the
// diagonal skipped).
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

[[maybe_unused]] const bool kOnCuda = register_implementation<SoftmaxParams>(
    "softmax", Device::kCuda, [](const SoftmaxParams&) { return std::make_unique<CudaSoftmax>(); });

}  // namespace
}  // namespace attnprobe::gpu
