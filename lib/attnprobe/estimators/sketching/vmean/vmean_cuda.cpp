#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/sketching/vmean/vmean.h"
#include "attnprobe/estimators/sketching/vmean/vmean_cuda_params.h"

// The CUDA version of `vmean` (vmean.cpp), with its causal form (running means).
namespace attnprobe::gpu {
namespace {

class CudaVMean final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out.resize(view.n(), view.pv());
    vmean_cuda({.v = view.vf.data(),
                .n = view.n(),
                .keys = view.vf.rows(),
                .pv = view.pv(),
                .causal = view.mask == Mask::kCausal,
                .out = out.data()});
  }
};

[[maybe_unused]] const bool kOnCuda = register_implementation<VMeanParams>(
    "vmean", Device::kCuda, [](const VMeanParams&) { return std::make_unique<CudaVMean>(); });

}  // namespace
}  // namespace attnprobe::gpu
