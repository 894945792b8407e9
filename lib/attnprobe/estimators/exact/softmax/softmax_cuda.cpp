#include "attnprobe/estimators/exact/softmax/softmax.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/gpu/kernels.h"

// The CUDA version of `softmax` (softmax.cpp): 3×TF32 on the tensor cores, fp32-level error (the
// conformance harness holds it to twice the CPU's), where the simple fp32 kernel's sequential sums err 9×
// the CPU's at n = 4096 (docs/history/gpu-runs.md, run 1). Causal form: the kernels' own (tiles above the
// diagonal skipped). Rows at positions against a cache, and windows: the decode kernel, float32 (the
// tensor-core kernel's 64-row tiles would waste most of their work on a few rows, and it pads K and V
// into a copy: a decode step's whole cost).
namespace attnprobe::gpu {
namespace {

KeyMask key_mask(Mask mask) {
  switch (mask) {
    case Mask::kCausal:
      return KeyMask::kCausal;
    case Mask::kWindow:
      return KeyMask::kWindow;
    case Mask::kFull:
      break;
  }
  return KeyMask::kFull;
}

// Rows at positions against the cache (decode steps, the last rows, a dump's own query rows) and windows:
// the decode kernel (decode_attention.cu), float32 or its float64 reference mode. n × pv.
MatrixF decode_rows(const HeadView& view, bool fp64) {
  std::vector<int64_t> positions(view.n());
  for (int64_t i = 0; i < view.n(); ++i) positions[i] = view.position(i);
  MatrixF out(view.n(), view.pv());
  decode_attention(view.qf.data(), positions.data(), view.kf.data(), view.vf.data(), view.n(), view.keys(), view.p(),
                   view.pv(), static_cast<float>(view.scale), key_mask(view.mask), view.window, fp64, out.data());
  return out;
}

// Self-attention under the full or causal mask goes to the tensor-core and warp-per-row kernels.
bool on_square_kernels(const HeadView& view) { return view.self_attention() && view.mask != Mask::kWindow; }

class CudaSoftmax final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    if (!on_square_kernels(view)) {
      out = decode_rows(view, false);
      return;
    }
    out.resize(view.n(), view.pv());
    exact_attention(view.qf.data(), view.kf.data(), view.vf.data(), view.n(), view.kf.rows(), view.p(), view.pv(),
                    static_cast<float>(view.scale), AttentionPrecision::kTf32x3, view.mask == Mask::kCausal,
                    out.data());
  }
  // The float64 reference on the device (`sweep --device cuda`): the fp64-accumulation kernels on the
  // float32 inputs, rounded to float at the end (the dumps are float32; the parity test holds it
  // within 1e-6 of the CPU's float64 path). n × pv.
  std::optional<MatrixD> reference(const HeadView& view, ThreadPool*) const override {
    if (!on_square_kernels(view)) return decode_rows(view, true).cast<double>();
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
